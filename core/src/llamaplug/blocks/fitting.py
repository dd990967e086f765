"""n_gpu_layers="auto": llama.cpp's own fitting of layers and context to free device memory.

This is common/fit.cpp of the pinned tree (built into libllamaplug-common), the code
llama-cli and llama-completion run by default. It loads the model's metadata
without allocating, measures what each device would hold, and lowers
n_gpu_layers (and, where n_ctx=0, the context) until every device keeps
`fit_target_mib` free. Only values still at llama.cpp's defaults are changed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import native_reason
from ..params import ContextParams, ModelParams
from ..raw import ffi, lib
from . import _native_log
from .backend import LlamaBackend
from .c_params import context_c_params
from .memory import HOST_BYTES_PER_CELL, memory_available

_STATUS = {0: "fitted", 1: "could not fit"}  # 2: an error
MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What the fit chose: n_gpu_layers, the context (its size) and the per-device split."""

    status: str
    n_gpu_layers: int
    context: ContextParams  # the context the fit made room for, n_ctx=0 resolved to the size it chose
    tensor_split: tuple[float, ...]
    n_overrides: int

    @property
    def n_ctx(self) -> int:
        return self.context.n_ctx


def wanted(model: ModelParams, context: ContextParams) -> bool:
    """Whether the fit can change anything: there are devices to offload to, or n_ctx is left to it.

    Measuring builds a context without allocating tensors, but llama.cpp still
    allocates its per-cell bookkeeping, so a context that could never exist is left
    to LlamaContext's own check instead of being measured.
    """
    if not model.fit_layers:
        return False
    if context.n_ctx * HOST_BYTES_PER_CELL > memory_available():
        return False
    offload = model.devices if model.devices is not None else LlamaBackend.init().offload_devices()
    return bool(offload) or context.n_ctx == 0


def fit(path: str, c_model: Any, context: ContextParams, target_mib: list[int],
        n_ctx_min: int) -> tuple[FitResult, list[Any]]:
    """Fit c_model (in place) and `context`; returns the result and buffers c_model now points into."""
    c_context = context_c_params(context)
    n_dev = int(lib.llama_max_devices())
    split = ffi.new("float[]", n_dev)
    overrides = ffi.new("struct llama_model_tensor_buft_override[]", int(lib.llama_max_tensor_buft_overrides()))
    # llama.cpp reads one margin per device it fits to, however many the user named.
    margins = ffi.new("size_t[]", [max(0, target_mib[min(i, len(target_mib) - 1)]) * MIB for i in range(n_dev)])
    # Silenced: a failure here is the real load's too, which logs it once (it was printed twice).
    with _native_log.capture_errors() as errors, _native_log.silenced():
        rc = lib.llamaplug_fit_params(path.encode(), ffi.addressof(c_model), ffi.addressof(c_context), split,
                                      overrides, margins, n_ctx_min)
    # An error here (an unreadable file, a context that cannot exist) is left to the real load,
    # which names it precisely; llama.cpp's CLI also goes on with the parameters as given.
    status = _STATUS.get(rc) or f"error: {native_reason(errors, 2)}"
    n_overrides = 0
    if c_model.tensor_buft_overrides != ffi.NULL:
        while overrides[n_overrides].pattern != ffi.NULL:
            n_overrides += 1
    shares = [float(split[i]) for i in range(n_dev)] if c_model.tensor_split == split else []
    while shares and shares[-1] == 0:
        shares.pop()
    fitted = context.replace(n_ctx=int(c_context.n_ctx)) if context.n_ctx == 0 and c_context.n_ctx else context
    result = FitResult(status, int(c_model.n_gpu_layers), fitted, tuple(shares), n_overrides)
    return result, [split, overrides, margins]
