"""llama.cpp's parameter structs from our pydantic params (bounds are checked by the params themselves)."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidParameterError
from ..params import ContextParams, ModelParams
from ..raw import ffi, lib
from .backend import LlamaBackend


def context_c_params(p: ContextParams, abort_flag: Any = None) -> Any:
    """llama_context_params for p (whose fields are already within what llama.cpp accepts).

    `abort_flag` (an ``int *`` kept alive by the caller) aborts a running decode when set.
    """
    c = lib.llama_context_default_params()
    for name in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_outputs_max", "n_threads", "yarn_ext_factor",
                 "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx", "defrag_thold",
                 "rope_freq_base", "rope_freq_scale", "embeddings", "offload_kqv", "no_perf", "op_offload",
                 "swa_full", "kv_unified"):
        setattr(c, name, getattr(p, name))
    c.n_threads_batch = p.n_threads_batch or p.n_threads
    c.abort_callback = lib.llamaplug_abort_on_interrupt
    c.abort_callback_data = ffi.NULL if abort_flag is None else abort_flag
    for name in ("rope_scaling_type", "pooling_type", "attention_type", "flash_attn_type", "type_k", "type_v"):
        setattr(c, name, int(getattr(p, name)))
    return c


def model_c_params(params: ModelParams) -> tuple[Any, list[Any]]:
    c = lib.llama_model_default_params()
    c.n_gpu_layers = params.gpu_layers
    c.split_mode = int(params.split_mode)
    c.main_gpu = params.main_gpu
    c.load_mode = params.load_mode
    c.vocab_only = params.vocab_only
    c.check_tensors = params.check_tensors
    keep: list[Any] = []
    if params.tensor_split is not None:
        n = int(lib.llama_max_devices())
        if len(params.tensor_split) > n:
            raise InvalidParameterError(
                f"tensor_split has {len(params.tensor_split)} entries, llama.cpp takes at most {n}",
                field="tensor_split",
            )
        split = ffi.new("float[]", n)
        split[0:len(params.tensor_split)] = params.tensor_split
        c.tensor_split = split
        keep.append(split)
    if params.devices is not None:
        chosen = ffi.new("ggml_backend_dev_t[]", [_offload_device(name) for name in params.devices] + [ffi.NULL])
        c.devices = chosen
        keep.append(chosen)
    return c, keep


def _offload_device(name: str) -> Any:
    dev = lib.ggml_backend_dev_by_name(name.encode()) if isinstance(name, str) else ffi.NULL
    if dev == ffi.NULL or lib.ggml_backend_dev_type(dev) == lib.GGML_BACKEND_DEVICE_TYPE_CPU:
        usable = LlamaBackend.init().offload_devices()
        why = "the CPU is always used; devices lists where to offload" if dev != ffi.NULL else "no such device"
        raise InvalidParameterError(f"devices: {name!r}: {why} (offload devices here: {usable or 'none'})",
                                    field="devices")
    return dev
