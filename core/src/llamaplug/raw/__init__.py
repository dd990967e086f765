"""The raw FFI layer: llama.h and the ggml backend registry, as cffi sees them.

`ffi` and `lib` are the compiled cffi module; every `llama_*`, `ggml_*`,
`gguf_*` function and constant of the pinned headers is reachable as an
attribute of this module (``llamaplug.raw.llama_backend_init()``). Nothing here
is safe: pointers are raw, and misuse crashes the process. The safe layer is
``llamaplug.blocks``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._cffi import ffi, lib

__all__ = ["ffi", "lib", "llama_backend_init", "llama_supports_gpu_offload", "llama_supports_rpc",
           "set_backend_loader"]

# Registers the installed backend plugins' modules and initialises llama.cpp; installed by
# the safe layer when it is imported (this layer imports nothing above it).
_backend_loader: Callable[[], object] | None = None


def set_backend_loader(loader: Callable[[], object]) -> None:
    global _backend_loader
    _backend_loader = loader


def llama_backend_init() -> None:
    """llama.cpp's llama_backend_init, after the installed backend plugins' modules are registered.

    ggml would otherwise search the executable's folder and the working directory for
    modules (the core's ggml is built without that search): this is how seed 003's
    raw flow gets exactly the modules of llamaplug's plugins.
    """
    if _backend_loader is None:
        lib.llama_backend_init()
    else:
        _backend_loader()


def llama_supports_gpu_offload() -> bool:
    """llama.cpp's answer, about the backends llamaplug loaded (loading them if nothing did yet)."""
    llama_backend_init()
    return bool(lib.llama_supports_gpu_offload())


def llama_supports_rpc() -> bool:
    llama_backend_init()
    return bool(lib.llama_supports_rpc())


def __getattr__(name: str) -> Any:
    if name == "LLAMA_MAX_DEVICES":  # seed 003's constant; a function in this llama.h
        return int(lib.llama_max_devices())
    try:
        return getattr(lib, name)
    except AttributeError:
        raise AttributeError(f"module 'llamaplug.raw' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(dir(lib)))
