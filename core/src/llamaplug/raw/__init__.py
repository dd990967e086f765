"""The raw FFI layer: llama.h and the ggml backend registry, as cffi sees them.

`ffi` and `lib` are the compiled cffi module; every `llama_*`, `ggml_*`,
`gguf_*` function and constant of the pinned headers is reachable as an
attribute of this module (``llamaplug.raw.llama_backend_init()``). Nothing here
is safe: pointers are raw, and misuse crashes the process. The safe layer is
``llamaplug.blocks``.
"""

from __future__ import annotations

from typing import Any

from ._cffi import ffi, lib

__all__ = ["ffi", "lib"]


def __getattr__(name: str) -> Any:
    try:
        return getattr(lib, name)
    except AttributeError:
        raise AttributeError(f"module 'llamaplug.raw' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(dir(lib)))
