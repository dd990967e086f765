"""One log line per request (logger "llamaplug.server.access"): method, path, status, duration, client.

Logged when the response is over (a stream's last chunk sent), so the duration is the whole
request's. The query string is left out (it may carry what a client would not want in a log),
as llama-server logs the path alone. Health probes (/health, /v1/health), which a load balancer
sends every few seconds, are logged at DEBUG only, as llama-server leaves them out of its request log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("llamaplug.server.access")

PROBES = frozenset({"/health", "/v1/health"})


class AccessLog:
    """The ASGI middleware (plain ASGI: no task group per request, as middleware.py's). `stopped` is called
    when the app's shutdown is complete (its models closed): uvicorn may end the process by raising the
    signal again right after, so a line said after it returns would be lost."""

    def __init__(self, app: ASGIApp, stopped: Callable[[], None] | None = None):
        self.app, self.stopped = app, stopped

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" and self.stopped is not None:
            await self.app(scope, receive, _on_shutdown_complete(send, self.stopped))
            return
        level = logging.DEBUG if scope.get("path") in PROBES else logging.INFO
        if scope["type"] != "http" or not log.isEnabledFor(level):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: list[int] = []

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        failed = True
        try:
            await self.app(scope, receive, sending)
            failed = False
        finally:
            # no status: the app raised before answering (the server sends a 500), or the client left first
            code = status[0] if status else (500 if failed else None)
            ms = (time.perf_counter() - start) * 1000
            client = scope.get("client")
            address = client[0] if client else None
            log.log(level, "%s %s %s %.1f ms %s", scope["method"], scope["path"], code or "-", ms, address or "-",
                    extra={"method": scope["method"], "path": scope["path"], "status": code,
                           "duration_ms": round(ms, 3), "client": address})


def _on_shutdown_complete(send: Send, stopped: Callable[[], None]) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "lifespan.shutdown.complete":
            stopped()
        await send(message)

    return sending
