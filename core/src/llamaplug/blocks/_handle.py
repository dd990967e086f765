"""The ownership pattern every safe object shares: one native handle, freed once."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import ClosedError
from ..raw import ffi


class NativeHandle:
    """Owns a pointer; `close()` frees it exactly once, `ffi.gc` is the safety net.

    Subclasses call `_adopt(ptr, free)` and use `self._ptr` (which raises
    ClosedError once closed). Dependents (contexts of a model) are closed first.
    """

    _what = "object"

    def _adopt(self, ptr: Any, free: Callable[[Any], None]) -> None:
        self._free = free
        self._raw = ffi.gc(ptr, free)
        self._close_lock = threading.Lock()
        self._dependents: weakref.WeakSet[NativeHandle] = weakref.WeakSet()

    @property
    def _ptr(self) -> Any:
        raw = getattr(self, "_raw", None)
        if raw is None:
            raise ClosedError(f"this {self._what} is closed")
        return raw

    def raw_handle(self) -> Any:
        """The native pointer, for a plugin's own C calls (valid while this object is open)."""
        return self._ptr

    def add_dependent(self, dependent: NativeHandle) -> None:
        """Close `dependent` before this object (a plugin's object that holds this one's pointer)."""
        self._ptr  # noqa: B018 - a closed owner says so
        self._dependents.add(dependent)

    @property
    def closed(self) -> bool:
        return getattr(self, "_raw", None) is None

    def close(self) -> None:
        """Free the native object now; further use raises ClosedError. Safe to call twice."""
        lock = getattr(self, "_close_lock", None)
        if lock is None:
            return
        with lock:
            raw = self._raw
            if raw is None:
                return
            for dependent in list(self._dependents):
                dependent.close()
            self._raw = None
            ffi.release(raw)  # runs the ffi.gc destructor now, and only once

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
