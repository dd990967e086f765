"""Stopping a request's work between its steps, from another thread: a flag the work checks.

    flag = CancelFlag()
    result = flag.run(work)          # work() with `flag` as its flag (in this thread: call it from a worker)
    flag.cancel()                    # from any thread: work() raises RequestCancelledError at its next check

Inside the work, `checkpoint()` raises once the flag is set; the long loops of a request
(tokenizing a long text in pieces, checking many messages, embedding many inputs) call it
between their steps. The flag travels in a context variable, so the layers between the
caller and the loops (a chat request's render and tokenization) need no argument for it,
and work with no flag (a library call) checks nothing.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

from ..errors import RequestCancelledError

T = TypeVar("T")

_flag: contextvars.ContextVar[CancelFlag | None] = contextvars.ContextVar("llamaplug_cancel_flag", default=None)


class CancelFlag:
    """Set once, from any thread; the work it was given to stops at its next `checkpoint()`."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def run(self, work: Callable[[], T]) -> T:
        """`work()` in a copy of the current context with this flag as its flag."""
        context = contextvars.copy_context()
        context.run(_flag.set, self)
        return context.run(work)


def checkpoint() -> None:
    """Raise RequestCancelledError if the running work's flag is set (nothing when it has none)."""
    flag = _flag.get()
    if flag is not None and flag.cancelled:
        raise RequestCancelledError("the request was cancelled (its client went away)")
