"""How `llamaplug serve` stops on SIGTERM or Ctrl-C (SIGINT), busy or not.

1. The first signal: stop accepting connections (idle keep-alive ones close); the requests running go on,
   for up to `grace` seconds (--shutdown-timeout). What no engine runs and a client would wait out the grace
   for ends at once: the app's `state.on_stop` (async callables; MCP tool calls and their servers), each
   request it ends answered with its API's error.
2. Then, or at once on a second signal: every loaded model's engine stops. Each job still running ends with
   a ClosedError, which each route's stream answers as it answers any error met mid-stream: its API's
   in-stream error event (OpenAI's `data: {"error": ...}` and [DONE], Anthropic's `event: error`, the
   Responses API's `error`, Ollama's `{"error": ...}` line); a request not yet streaming gets a 503.
   The streams get a moment to send that last event and close.
3. The app's shutdown closes the models (the engine threads joined before the interpreter exits); the
   process exits 0.

uvicorn's own handling, which this replaces: it waited for open connections without a limit (a client
streaming a long reply kept the server up until it gave up), ignored a second SIGTERM, and on a second
Ctrl-C cancelled the request tasks (a CancelledError traceback each) and skipped the app's shutdown (the
engine thread still decoding while the interpreter exited: a segfault), then raised the signal again
(exit 143 for SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from ..errors import ClosedError

log = logging.getLogger("llamaplug.server")

DEFAULT_GRACE = 5.0  # seconds (--shutdown-timeout): with the rest, one signal exits well within 10 s
# seconds the streams have to send their last event once their jobs ended (a client that does not read
# them is cut after it)
FLUSH = 2.0
WHY = "the server is shutting down"


class Server(uvicorn.Server):
    """uvicorn's server, stopped as the module says; `engines()` (called on the event loop) gives the
    engines to stop at the end of the grace time (the app's models: `engines_of(app)`)."""

    def __init__(self, config: uvicorn.Config, grace: float = DEFAULT_GRACE,
                 engines: Callable[[], list[Any]] | None = None):
        super().__init__(config)
        self.grace = grace
        self._engines = engines or (lambda: engines_of(config.app))
        self.signals = 0  # how many were received

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn's, less raising the signal again at the end: a server that stopped as asked exits 0
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: Any) -> None:
        # A signal handler: only flags here (it runs between any two bytecodes of the event loop)
        self.signals += 1
        self.should_exit = True

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        state = self.server_state
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(state.connections):
            connection.shutdown()  # an idle one closes now, a busy one after its response
        for stop in getattr(getattr(self.config.app, "state", None), "on_stop", ()):
            try:
                await stop()
            except Exception:
                log.exception("stopping %s failed", stop)
        await self._until(lambda: not state.connections, self.grace, hurry=True)
        if state.connections:
            log.warning("stopping %d requests still running (%s)", len(state.tasks),
                        "a second signal" if self.signals > 1 else f"--shutdown-timeout {self.grace:g} s")
            await asyncio.to_thread(_stop, self._engines())
            await self._until(lambda: not state.tasks, FLUSH)
        if state.tasks:  # not ended by their engine (waiting for a load, a client that does not read)
            log.warning("cutting %d requests that did not end", len(state.tasks))
            with _quiet_cancellations():
                for task in state.tasks:
                    task.cancel()
                await asyncio.wait(set(state.tasks), timeout=FLUSH)
        for connection in list(state.connections):
            connection.transport.close()
        for server in self.servers:
            await server.wait_closed()
        await self.lifespan.shutdown()

    async def _until(self, done: Callable[[], bool], seconds: float, hurry: bool = False) -> None:
        """Until `done()` or `seconds` pass (or, with `hurry`, a second signal comes)."""
        end = time.monotonic() + seconds
        while not done() and time.monotonic() < end and not (hurry and self.signals > 1):
            await asyncio.sleep(0.05)


def engines_of(app: Any) -> list[Any]:
    """The engines of the models `app` (create_app_for's) has loaded."""
    models = getattr(getattr(app, "state", None), "models", None)
    return [engine for _, engine in models.engines()] if models is not None else []


def _stop(engines: list[Any]) -> None:
    for engine in engines:
        engine.close(ClosedError(WHY))


class _CancelledFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


@contextlib.contextmanager
def _quiet_cancellations() -> Iterator[None]:
    """uvicorn logs a request task it cancels as "Exception in ASGI application" with the traceback: here a
    cut request was said in one line already."""
    logger, quiet = logging.getLogger("uvicorn.error"), _CancelledFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def serve(app: Any, grace: float = DEFAULT_GRACE, sockets: list[Any] | None = None, **options: Any) -> None:
    """Serve `app` (uvicorn.Config's `options`: host, port, ...) until a signal stops it as above."""
    Server(uvicorn.Config(app, **options), grace).run(sockets=sockets)
