"""The raw layer of the plugin: the compiled cffi module over libmtmd (mtmd.h, mtmd-helper.h).

llama.h's types are the core's (`ffi.include`), so the core's `llama_model *` and
`llama_context *` pass straight through. Nothing here is safe.
"""

from __future__ import annotations

import atexit

from llamaplug import LLAMA_CPP_COMMIT
from llamaplug.errors import BackendMismatchError
from llamaplug.plugin_api import native_log_callback, native_log_sink
from llamaplug.raw import ffi as core_ffi

from . import _build_info  # written by the build

if _build_info.LLAMA_CPP_COMMIT != LLAMA_CPP_COMMIT:
    raise BackendMismatchError(f"llamaplug-mtmd was built from llama.cpp {_build_info.LLAMA_CPP_COMMIT}, the core from "
                               f"{LLAMA_CPP_COMMIT}: reinstall the plugin after the core")

from ._cffi import ffi, lib  # noqa: E402

__all__ = ["ffi", "lib", "route_log"]

_routed = [False]


def route_log() -> None:
    """libmtmd's and its helper's log lines go through the core's native log callback (logger
    "llamaplug.native", and `capture_errors()` sees them), as llama.cpp's own do."""
    if _routed[0]:
        return
    callback = _callback(native_log_callback())
    lib.mtmd_log_set(callback, ffi.NULL)
    lib.mtmd_helper_log_set(callback, ffi.NULL)
    _routed[0] = True
    atexit.register(_unroute)


def _unroute() -> None:
    # Native destructors may log after Python is gone; give them the core's C sink.
    sink = _callback(native_log_sink())
    lib.mtmd_log_set(sink, ffi.NULL)
    lib.mtmd_helper_log_set(sink, ffi.NULL)


def _callback(core_function) -> object:
    # Struct types are shared with the core's module (ffi.include), function-pointer types are not:
    # the same C function, retyped by address.
    return ffi.cast("ggml_log_callback", int(core_ffi.cast("uintptr_t", core_function)))
