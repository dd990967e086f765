"""Python samplers inside llama.cpp's own chain, through its `llama_sampler_i` interface.

An object with ``apply(candidates)`` (and optionally ``accept(token)``, ``reset()``,
``clone()``) becomes a native sampler whose callbacks are cffi ``extern "Python"``
functions, so it composes with native samplers before and after it. `Candidates`
gives ``ids`` and ``logits`` as writable numpy views over llama.cpp's
``llama_token_data_array`` (no copy), ``sorted``, ``selected`` (settable, for
samplers that pick) and ``keep(n)``. An exception raised in a callback cannot cross
the C frames: it is stored, the candidates are left as they were, and it is raised
again once the native call returns (`_callback_errors.raise_stored`), with the chain
still usable.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import numpy as np

from ..errors import InvalidParameterError
from ..raw import ffi, lib
from . import _callback_errors

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])

# Native sampler ctx handle -> (the Python object, its name as a C string). The handle keeps the
# object alive while llama.cpp holds the sampler; `free` drops it.
_live: dict[Any, tuple[Any, Any, Any]] = {}
_lock = threading.Lock()


class Candidates:
    """llama.cpp's candidate array during one `apply` call (do not keep it past the call)."""

    __slots__ = ("_cur", "_view")

    def __init__(self, cur: Any):
        self._cur = cur
        self._view = np.frombuffer(ffi.buffer(cur.data, cur.size * TOKEN_DATA.itemsize), dtype=TOKEN_DATA)

    @property
    def ids(self) -> np.ndarray:
        return self._view["id"]

    @property
    def logits(self) -> np.ndarray:
        return self._view["logit"]

    @property
    def probs(self) -> np.ndarray:
        """The `p` field: set by samplers that compute probabilities (dist, softmax users)."""
        return self._view["p"]

    def __len__(self) -> int:
        return int(self._cur.size)

    @property
    def sorted(self) -> bool:
        return bool(self._cur.sorted)

    @sorted.setter
    def sorted(self, value: bool) -> None:
        self._cur.sorted = bool(value)

    @property
    def selected(self) -> int:
        """Index (into ids/logits, not a token id) of the chosen candidate; -1 while none is."""
        return int(self._cur.selected)

    @selected.setter
    def selected(self, index: int) -> None:
        if not -1 <= index < self._cur.size:
            raise InvalidParameterError(f"selected={index} is outside -1..{self._cur.size - 1}", field="selected")
        self._cur.selected = index

    def keep(self, n: int) -> None:
        """Keep only the first n candidates (sort them first to keep the best)."""
        if not 1 <= n <= self._cur.size:
            raise InvalidParameterError(f"keep({n}): must keep 1..{self._cur.size} candidates", field="n")
        self._cur.size = n
        self._view = self._view[:n]


def _entry(smpl: Any) -> tuple[Any, Any, Any]:
    return _live[int(ffi.cast("uintptr_t", smpl.ctx))]


@ffi.def_extern(onerror=_callback_errors.store)
def _llamaplug_sampler_name(smpl):
    return _entry(smpl)[1]


@ffi.def_extern(onerror=_callback_errors.store)
def _llamaplug_sampler_accept(smpl, token):
    obj = _entry(smpl)[0]
    accept = getattr(obj, "accept", None)
    if accept is not None:
        accept(int(token))


@ffi.def_extern(onerror=_callback_errors.store)
def _llamaplug_sampler_apply(smpl, cur_p):
    _entry(smpl)[0].apply(Candidates(cur_p))


@ffi.def_extern(onerror=_callback_errors.store)
def _llamaplug_sampler_reset(smpl):
    reset = getattr(_entry(smpl)[0], "reset", None)
    if reset is not None:
        reset()


@ffi.def_extern(onerror=_callback_errors.store)
def _llamaplug_sampler_clone(smpl):
    obj, name, _ = _entry(smpl)
    clone = getattr(obj, "clone", None)
    twin = clone() if clone is not None else copy.deepcopy(obj)
    return _native(twin, ffi.string(name).decode())


@ffi.def_extern(onerror=_callback_errors.store)
def _llamaplug_sampler_free(smpl):
    with _lock:
        _live.pop(int(ffi.cast("uintptr_t", smpl.ctx)), None)


_iface: Any = None


def _interface() -> Any:
    global _iface
    if _iface is None:  # one interface for every Python sampler; it lives as long as the process
        iface = ffi.new("struct llama_sampler_i *")
        iface.name = lib._llamaplug_sampler_name
        iface.accept = lib._llamaplug_sampler_accept
        iface.apply = lib._llamaplug_sampler_apply
        iface.reset = lib._llamaplug_sampler_reset
        iface.clone = lib._llamaplug_sampler_clone
        iface.free = lib._llamaplug_sampler_free
        _iface = iface
    return _iface


def _native(obj: Any, name: str) -> Any:
    handle = ffi.new_handle(obj)
    c_name = ffi.new("char[]", name.encode("utf-8", "replace"))
    with _lock:
        _live[int(ffi.cast("uintptr_t", handle))] = (obj, c_name, handle)
    ptr = lib.llama_sampler_init(_interface(), handle)
    if ptr == ffi.NULL:
        with _lock:
            _live.pop(int(ffi.cast("uintptr_t", handle)), None)
    return ptr


def native_sampler(obj: Any, name: str) -> Any:
    """A native llama_sampler * whose callbacks call `obj` (freed by llama.cpp, or by its chain)."""
    if not callable(getattr(obj, "apply", None)):
        raise InvalidParameterError(f"sampler {name!r}: {type(obj).__name__} has no apply(candidates) method",
                                    field="sampler")
    return _native(obj, name)
