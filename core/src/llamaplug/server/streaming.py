"""How a route answers over time: server-sent events, and work that stops when its client goes away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..blocks.cancellation import CancelFlag
from ..errors import LlamaError
from .dialects import OPENAI, named_event
from .errors import ClientGoneError

T = TypeVar("T")


def sse(payloads: AsyncIterator[str]) -> StreamingResponse:
    """Each JSON payload as one event, then [DONE]; a LlamaError met on the way is the last payload."""
    return StreamingResponse(_events(payloads), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _events(payloads: AsyncIterator[str]) -> AsyncIterator[str]:
    try:
        async for payload in payloads:
            yield f"data: {payload}\n\n"
    except LlamaError as exc:  # the status line is sent: the error goes in the stream
        yield OPENAI.stream_error(exc)
    yield "data: [DONE]\n\n"


def named_sse(events: AsyncIterator[tuple[str, str]], error: Callable[[LlamaError], str]) -> StreamingResponse:
    """Each (name, JSON payload) as one named event (`event: NAME`), as Anthropic's and the Responses API's streams.

    No [DONE]: those streams end with an event of their own. A LlamaError met on the way is the last
    event, `error(exc)` (the dialect's, framing included). A client that goes away cancels the generator,
    and with it the job (its slot is free at the engine's next step), as for `sse`.
    """
    return StreamingResponse(_named(events, error), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def _named(events: AsyncIterator[tuple[str, str]], error: Callable[[LlamaError], str]) -> AsyncIterator[str]:
    try:
        async for name, payload in events:
            yield named_event(name, payload)
    except LlamaError as exc:
        yield error(exc)


async def off_loop(work: Callable[[], T], request: Request | None = None) -> T:
    """`work()` in a worker thread: what a request costs before the engine (tokenizing, the chat template,
    a grammar) grows with the request, and on the event loop one long prompt stalled every other client,
    /health included, for seconds.

    With `request`, the work stops when its client goes away: the work's CancelFlag is set, and it
    raises at its next check between steps (a piece of a long text tokenized, 1024 messages checked, an
    input embedded), which this waits for, so its thread and memory are free when this raises the 499. An
    abandoned 3 MB chat otherwise rendered and tokenized on for minutes, holding a worker thread and
    hundreds of MB.
    """
    if request is None:
        return await asyncio.to_thread(work)
    flag = CancelFlag()
    task = asyncio.ensure_future(asyncio.to_thread(flag.run, work))
    gone = asyncio.ensure_future(disconnected(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # (also when this request's own task is cancelled: a server shutting down)
        gone.cancel()
        if not task.done():
            flag.cancel()
    if task not in done:
        with contextlib.suppress(Exception):  # RequestCancelledError, or what it met before its next check
            await asyncio.shield(task)  # the work ends at its next check (its result, if it won, is dropped)
        raise ClientGoneError("the client went away")
    return task.result()


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """Run `work`, cancelling it if the client disconnects first.

    The ASGI server's own http.disconnect message says so: no polling, which cost the event loop (and so
    the decode threads beside it) a wakeup and a task group every 50 ms per waiting request.
    """
    return await unless(disconnected(request), work)


async def unless(gone: Awaitable[None], work: Awaitable[T], said: str = "the client went away") -> T:
    """Run `work`, cancelling it if `gone` (a client's going away) ends first: then ClientGoneError(`said`)."""
    task = asyncio.ensure_future(work)
    left = asyncio.ensure_future(gone)
    try:
        done, _ = await asyncio.wait({task, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # (also when this request's own task is cancelled)
        left.cancel()
        task.cancel()  # a no-op once it is done
    if task not in done:
        raise ClientGoneError(said)
    return task.result()


async def disconnected(request: Request) -> None:
    """Ends when the client of `request` goes away (the ASGI server's http.disconnect message)."""
    # The body was read before the route ran: the next message is the disconnect (or the end of the response).
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)  # a server that answers with empty body parts instead must not make this spin
