"""Persistent CPU threadpools for a context, attached as llama.cpp's own tools attach them.

Without one, ggml-cpu starts and joins a throwaway pool of threads for every graph it
computes, every generated token included. The pool's functions live in the CPU backend
module (loaded at run time), so they are looked up through its registry.
"""

from __future__ import annotations

from typing import Any

from ..raw import ffi, lib

_NEW = "struct ggml_threadpool * (*)(struct ggml_threadpool_params *)"
_FREE = "void (*)(struct ggml_threadpool *)"


def _functions() -> tuple[Any, Any] | None:
    dev = lib.ggml_backend_dev_by_type(lib.GGML_BACKEND_DEVICE_TYPE_CPU)
    if dev == ffi.NULL:
        return None
    reg = lib.ggml_backend_dev_backend_reg(dev)
    new = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_threadpool_new")
    free = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_threadpool_free")
    if new == ffi.NULL or free == ffi.NULL:
        return None
    return ffi.cast(_NEW, new), ffi.cast(_FREE, free)


class ThreadPools:
    """One pool for generation and, where n_threads_batch differs, one for batches (as common_threadpools)."""

    def __init__(self, n_threads: int, n_threads_batch: int):
        self._free_fn: Any = None
        self.pool = self.batch = ffi.NULL
        self._create(n_threads, n_threads_batch)

    def _create(self, n_threads: int, n_threads_batch: int) -> None:
        fns = _functions()
        if fns is None:
            return  # no CPU backend module: ggml keeps its per-graph pools
        new, self._free_fn = fns
        params = ffi.new("struct ggml_threadpool_params *", lib.ggml_threadpool_params_default(n_threads))
        if n_threads_batch != n_threads:
            batch = ffi.new("struct ggml_threadpool_params *", lib.ggml_threadpool_params_default(n_threads_batch))
            self.batch = new(batch)
            params.paused = True  # the generation pool wakes when a single-token graph needs it
        self.pool = new(params)

    def attach(self, ctx: Any) -> None:
        if self.pool != ffi.NULL:
            lib.llama_attach_threadpool(ctx, self.pool, self.batch)

    def free(self) -> None:
        """After the context that used them is freed or detached."""
        for name in ("pool", "batch"):
            pool = getattr(self, name)
            if pool != ffi.NULL:
                self._free_fn(pool)
                setattr(self, name, ffi.NULL)

    def resize(self, ctx: Any, n_threads: int, n_threads_batch: int) -> None:
        """New pools for new thread counts: ggml caps a graph's threads at its pool's size."""
        lib.llama_detach_threadpool(ctx)
        self.free()
        self._create(n_threads, n_threads_batch)
        self.attach(ctx)
