"""One HTTP request carried between processes, and an ASGI app answering it as a stream of picklable items.

A Ray Serve replica holds the server's own ASGI app (server.app.create_app) and answers
the ingress's forwarded requests through it: the same routes, error shapes and
streaming as `llamaplug serve`, with no copy of the server's code. Nothing here
imports Ray: the bridge is plain asyncio and is tested without a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

# Set by the transport, not by the app: the ingress computes its own (a proxy forwarding them would send wrong ones).
_HOP_BY_HOP = frozenset({b"content-length", b"transfer-encoding", b"connection", b"keep-alive"})


@dataclasses.dataclass(frozen=True)
class Forwarded:
    """An HTTP request as the ingress received it: method, path, query string, headers (bytes pairs), body."""

    method: str
    path: str
    query_string: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""


@dataclasses.dataclass(frozen=True)
class Head:
    """The first item of an answer: its status and headers; the body's chunks (bytes) follow."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]

    def header(self, name: str) -> str | None:
        key = name.lower().encode()
        return next((v.decode("latin-1") for k, v in self.headers if k.lower() == key), None)


async def answer(app: ASGIApp, request: Forwarded, extra_headers: tuple[tuple[bytes, bytes], ...] = ()
                 ) -> AsyncIterator[Head | bytes]:
    """`app`'s answer to `request`: one Head, then the body's chunks as the app sends them.

    Closing the iterator early (the client went away) is a disconnect: the app's
    `receive` says so and its task is cancelled, so a streamed completion frees its slot.
    """
    items: asyncio.Queue[Message | None] = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await items.put(message)

    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": request.method, "scheme": "http", "path": request.path, "raw_path": request.path.encode(),
        "query_string": request.query_string, "root_path": "", "headers": list(request.headers),
        "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80),
    }
    task = asyncio.ensure_future(app(scope, receive, send))
    task.add_done_callback(lambda _: items.put_nowait(None))
    started = False
    try:
        while (message := await items.get()) is not None:
            if message["type"] == "http.response.start":
                started = True
                headers = tuple((bytes(k), bytes(v)) for k, v in message.get("headers", ())
                                if bytes(k).lower() not in _HOP_BY_HOP)
                yield Head(int(message["status"]), headers + extra_headers)
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    break
        if not started:  # the app ended without answering: what a server would say
            yield Head(500, ((b"content-type", b"application/json"),) + extra_headers)
            yield (b'{"error": {"message": "the server ended the request without an answer", '
                   b'"type": "server_error", "param": null, "code": null}}')
    finally:
        gone.set()
        if not task.done():
            await asyncio.sleep(0)  # let the app see the disconnect first, as behind a real server
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


class Lifespan:
    """The ASGI lifespan of `app`: `startup()` when the holder starts, `shutdown()` when it stops (closes the model)."""

    def __init__(self, app: ASGIApp):
        self._app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._answers: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Future[None] | None = None

    async def startup(self) -> None:
        scope: Scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        self._task = asyncio.ensure_future(self._app(scope, self._inbox.get, self._answers.put))
        await self._event("startup")

    async def shutdown(self) -> None:
        if self._task is not None and not self._task.done():
            await self._event("shutdown")
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 30)

    async def _event(self, name: str) -> None:
        await self._inbox.put({"type": f"lifespan.{name}"})
        assert self._task is not None
        getter = asyncio.ensure_future(self._answers.get())
        await asyncio.wait({getter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():  # the app does not speak lifespan (it may raise for the scope): nothing to wait for
            getter.cancel()
