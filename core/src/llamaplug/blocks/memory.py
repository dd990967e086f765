"""Will a context fit? A lower bound of its KV cache against the memory there is now.

Kept apart from the context so that n_gpu_layers="auto" (fitting) can ask the same
question before a model exists.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ContextTooLargeError
from ..params import LLAMA_MAX_SEQ, ContextParams
from ..raw import ffi, lib
from ._text import read_string

if TYPE_CHECKING:
    from .model import LlamaModel

# Host bytes llama.cpp value-initialises per KV cell before it allocates the cache
# tensors (llama_kv_cells: pos, shift, ext{x, y, tok}, std::bitset<LLAMA_MAX_SEQ>).
HOST_BYTES_PER_CELL = 4 + 4 + 12 + LLAMA_MAX_SEQ // 8


def memory_available() -> int:
    """Bytes a new allocation could get now: available RAM + free swap + free memory of non-CPU devices."""
    host = 0
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        host = sum(int(fields[k].split()[0]) * 1024 for k in ("MemAvailable", "SwapFree") if k in fields)
    except (OSError, ValueError):
        pass
    if not host:  # not Linux: all of RAM
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    devices = 0
    free, total = ffi.new("size_t *"), ffi.new("size_t *")
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if lib.ggml_backend_dev_type(dev) != lib.GGML_BACKEND_DEVICE_TYPE_CPU:
            lib.ggml_backend_dev_memory(dev, free, total)
            devices += int(free[0])
    return host + devices


def kv_bytes_per_cell(p: ContextParams, model: LlamaModel) -> int:
    """A lower bound of the KV-cache tensor bytes per cell (0 where the layout is not plain attention)."""
    if lib.llama_model_is_hybrid(model._ptr):
        return 0  # only some layers have a KV cache

    def meta(key: str) -> str:
        return read_string(lambda buf, n: lib.llama_model_meta_val_str(model._ptr, key.encode(), buf, n))

    arch = meta("general.architecture")
    if meta(f"{arch}.attention.kv_lora_rank"):
        return 0  # MLA caches a compressed latent, not per-head K/V
    n_head = model.n_head
    try:
        k_len = int(meta(f"{arch}.attention.key_length") or (model.n_embd // n_head if n_head else 0))
        v_len = int(meta(f"{arch}.attention.value_length") or k_len)
    except ValueError:
        return 0
    layers = 1 if lib.llama_model_n_swa(model._ptr) > 0 else model.n_layer  # SWA layers are capped
    per_value = 2  # F16 bytes
    return int(layers * int(lib.llama_model_n_head_kv(model._ptr))
               * (k_len * per_value * p.type_k.memory_factor + v_len * per_value * p.type_v.memory_factor))


def check_fits(p: ContextParams, model: LlamaModel) -> None:
    """Refuse a context whose KV cache cannot fit in the memory there is now.

    llama.cpp zero-fills its per-cell bookkeeping (about 52 bytes a cell) and
    then the cache tensors, so a huge n_ctx touches gigabytes of RAM before it
    fails, or is killed (on a 24 GB machine n_ctx=2**31-1 ends in std::bad_alloc
    after 30 s and 8 GB, n_ctx=2**30 runs for minutes). The estimate is a lower
    bound, compared with available RAM + free swap + free device memory (summed,
    so generous): it refuses only what cannot be allocated.
    """
    if lib.llama_model_is_recurrent(model._ptr):
        return  # the recurrent state does not grow with n_ctx
    n_ctx = model.n_ctx_for(p.n_ctx)
    per_cell = HOST_BYTES_PER_CELL + kv_bytes_per_cell(p, model)
    need = n_ctx * per_cell
    limit = memory_available()
    if need > limit:
        raise ContextTooLargeError(
            f"n_ctx={n_ctx} needs at least {need / 2**30:.1f} GiB for the KV cache of {model.path.name} "
            f"({per_cell} bytes per token), more than the {limit / 2**30:.1f} GiB of memory available "
            f"(RAM, swap and devices); lower n_ctx (at most about {limit // per_cell}; the model was trained on "
            f"{model.n_ctx_train} positions, and n_ctx=0 takes that)"
        )
