"""The event pump: jobs to the engine, their chunks back to the caller, for threads and asyncio alike.

The engine hands each job's events to the job's sink, on its worker thread.
`Submission` is all the logic: it tags each job's events with the job's index, gives
the jobs to the engine, turns an event into (index, chunk) or raises it, and on leaving
cancels the jobs that have not ended. `stream` (threads: a queue.SimpleQueue) and
`astream` (asyncio: an asyncio.Queue fed with call_soon_threadsafe) are its two loops.

`gather` and `agather` are for a caller that wants the result, not the stream: the
events stay on the engine's thread until the jobs have ended, and the caller is woken
once, not once per token (a wakeup per token kept the event loop of a busy server
taking CPU from the decode threads beside it).
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
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


def gather(engine: Engine, jobs: Sequence[Job]) -> list[tuple[int, CompletionChunk]]:
    """Submit `jobs`, wait until each has ended, and give every (index, chunk) in the order they came.

    An error event is raised, the first one as soon as it comes (the other jobs are cancelled).
    """
    if not jobs:
        return []
    ready = threading.Event()
    box = _Gathered(len(jobs), ready.set)
    with Submission(engine, jobs, box.put) as run:
        ready.wait()
        return [run.take(item) for item in list(box.items)]


async def agather(engine: Engine, jobs: Sequence[Job]) -> list[tuple[int, CompletionChunk]]:
    """As `gather`, never blocking the event loop; cancelling the task cancels the jobs."""
    if not jobs:
        return []
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    box = _Gathered(len(jobs), functools.partial(loop.call_soon_threadsafe, _resolve, done))
    with Submission(engine, jobs, box.put) as run:
        await done
        return [run.take(item) for item in list(box.items)]


def gather_chunks(engine: Engine, job: Job) -> list[CompletionChunk]:
    """`gather` of one job: its chunks."""
    return [chunk for _, chunk in gather(engine, [job])]


async def agather_chunks(engine: Engine, job: Job) -> list[CompletionChunk]:
    """`agather` of one job: its chunks."""
    return [chunk for _, chunk in await agather(engine, [job])]


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


class _Gathered:
    """The events of `n` jobs, kept as they come (on the engine's thread); `ready()` once, when every job has
    ended or at the first error event."""

    __slots__ = ("items", "left", "ready")

    def __init__(self, n: int, ready: Callable[[], Any]):
        self.items: list[tuple[int, Event]] = []
        self.left, self.ready = n, ready

    def put(self, item: tuple[int, Event]) -> None:
        self.items.append(item)
        if self.left <= 0:  # ready() was called
            return
        event = item[1]
        if isinstance(event, BaseException):
            self.left = 0
        elif event.stop_reason is not None:
            self.left -= 1
        if self.left == 0:
            self.ready()


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():  # (a task cancelled meanwhile has cancelled it)
        done.set_result(None)
