"""The event pump: jobs to the engine, their chunks back to the caller, for threads and asyncio alike.

The engine hands each job's events to the job's sink, on its worker thread.
`Submission` is all the logic: it tags each job's events with the job's index, gives
the jobs to the engine, turns an event into (index, chunk) or raises it, and on leaving
cancels the jobs that have not ended. `stream` (threads: a queue.SimpleQueue) and
`astream` (asyncio: an asyncio.Queue fed with call_soon_threadsafe) are its two loops.
"""

from __future__ import annotations

import asyncio
import functools
import queue
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from .completion import CompletionChunk
from .engine import Engine, Job

Event = CompletionChunk | BaseException


class Submission:
    """`jobs` given to `engine` now, their events going to `put` as (index, event); a context manager.

    Leaving the `with` block (the jobs ended, or the caller stopped early, or an
    error) cancels the jobs that have not ended: their slots are free at the
    engine's next step.
    """

    def __init__(self, engine: Engine, jobs: Sequence[Job], put: Callable[[tuple[int, Event]], Any]):
        self.engine, self.jobs, self.left = engine, list(jobs), len(jobs)
        for i, job in enumerate(self.jobs):
            job.sink = _Sink(put, i)
        for job in self.jobs:
            engine.submit(job)

    def take(self, item: tuple[int, Event]) -> tuple[int, CompletionChunk]:
        """An (index, event) from the queue as (index, chunk); an error event is raised.

        A final chunk (stop_reason set) ends its job: `left` counts the jobs still running.
        """
        i, event = item
        if isinstance(event, BaseException):
            raise event
        if event.stop_reason is not None:
            self.left -= 1
        return i, event

    def cancel(self) -> None:
        """Cancel every job that has not ended, and wake the engine to free their slots."""
        if self.left:
            for job in self.jobs:
                job.cancel()
            self.engine.wake()

    def __enter__(self) -> Submission:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


def stream(engine: Engine, jobs: Sequence[Job]) -> Iterator[tuple[int, CompletionChunk]]:
    """Submit `jobs` (at the first next()) and yield (index, chunk) until each has ended.

    Leaving early (break, close, an exception) cancels what has not ended.
    """
    events: queue.SimpleQueue[tuple[int, Event]] = queue.SimpleQueue()
    with Submission(engine, jobs, events.put) as run:
        while run.left:
            yield run.take(events.get())


async def astream(engine: Engine, jobs: Sequence[Job]) -> AsyncIterator[tuple[int, CompletionChunk]]:
    """As `stream`, never blocking the event loop; cancelling the task, or leaving early, cancels the jobs.

    Once the loop is closed, call_soon_threadsafe raises in the engine's thread: the engine cancels the job.
    """
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
    with Submission(engine, jobs, functools.partial(loop.call_soon_threadsafe, events.put_nowait)) as run:
        while run.left:
            yield run.take(await events.get())


def chunks(engine: Engine, job: Job) -> Iterator[CompletionChunk]:
    """`stream` of one job: its chunks."""
    for _, chunk in stream(engine, [job]):
        yield chunk


async def achunks(engine: Engine, job: Job) -> AsyncIterator[CompletionChunk]:
    """`astream` of one job: its chunks."""
    async for _, chunk in astream(engine, [job]):
        yield chunk


class _Sink:
    """A job's sink: its events, tagged with its index, to the caller's queue."""

    __slots__ = ("put", "index")

    def __init__(self, put: Callable[[tuple[int, Event]], Any], index: int):
        self.put, self.index = put, index

    def __call__(self, event: Event) -> None:
        self.put((self.index, event))
