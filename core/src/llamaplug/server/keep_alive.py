"""Keep-alive (Ollama's `keep_alive`) and sleep (`sleep_idle`): the idle timers that unload a model nobody used
for that long, and a request's `keep_alive` read as seconds. The registry starts a model's timer after each
request and stops it when a request takes the model (event-loop thread only)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from . import durations
from .api_error import BadRequestError
from .served import ModelEntry, ModelState

Unload = Callable[[ModelEntry, ModelState], Coroutine[Any, Any, None]]


class IdleTimers:
    """The server's `keep_alive` (idle seconds until a model is unloaded) and `sleep_idle` (until it sleeps);
    None or negative: never. `unload(entry, state)` unloads a model; `background(work)` runs a task nobody
    awaits."""

    def __init__(self, keep_alive: float | None, sleep_idle: float | None, unload: Unload,
                 background: Callable[[Coroutine[Any, Any, None]], None]):
        self.keep_alive, self.sleep_idle = keep_alive, sleep_idle
        self._unload, self._background = unload, background

    def start(self, entry: ModelEntry) -> None:
        """After a request: start the idle timer of `entry` (keep-alive or sleep) if nothing uses it."""
        if entry.users or entry.wanted or entry.spec is None or entry.served is None:
            return
        if entry.keep_alive is not None:  # a request's own, as Ollama's: it alone says
            timers = [(entry.keep_alive, ModelState.UNLOADED)]
        else:
            timers = [(self.keep_alive, ModelState.UNLOADED), (self.sleep_idle, ModelState.SLEEPING)]
        timers = [(t, s) for t, s in timers if t is not None and t >= 0]
        if not timers:
            return
        delay, state = min(timers, key=lambda t: t[0])
        self.cancel(entry)
        loop = asyncio.get_running_loop()
        entry.timer = loop.call_later(delay, lambda: self._background(self._idle_unload(entry, state)))

    async def _idle_unload(self, entry: ModelEntry, state: ModelState) -> None:
        entry.timer = None
        if entry.users or entry.wanted or entry.loading is not None or entry.served is None:
            return
        await self._unload(entry, state)
        if entry.keep_alive == 0:  # "unload after this request" is done: a later load keeps the server's own
            entry.keep_alive = None

    @staticmethod
    def cancel(entry: ModelEntry) -> bool:
        """Stop the idle timer of `entry`; whether one ran."""
        if entry.timer is None:
            return False
        entry.timer.cancel()
        entry.timer = None
        return True

    @staticmethod
    def expires_in(entry: ModelEntry) -> float | None:
        """Seconds until the idle timer of `entry` unloads it; None: no timer runs."""
        if entry.timer is None:
            return None
        return max(0.0, entry.timer.when() - asyncio.get_running_loop().time())


def parse_keep_alive(value: float | int | str | None, field: str = "keep_alive") -> float | None:
    """Seconds from a request's `keep_alive` (see durations.py); a 400 naming `field` if it is no duration."""
    if value is None:
        return None
    try:
        return durations.seconds(value)
    except ValueError as exc:
        raise BadRequestError(f"{field}: {exc}", param=field) from None
