"""Adapters: LoRA adapters and control vectors, applied to a context without reloading the model.

    lora = LoraAdapter.load(model, "style.gguf")
    ctx.set_lora(lora, 0.8)          # several at once, each with its scale; change it between calls
    ctx.remove_lora(lora)
    ctx.apply_control_vector(ControlVector.load("happy.gguf"), 10, 20)

The context's side (`ContextAdapters`, mixed into LlamaContext) keeps what is applied.

An adapter made for another model (architecture, tensor shapes) is an InvalidModelError
with llama.cpp's reason. Control vector files are GGUFs with one `direction.<layer>`
tensor of n_embd floats per layer, as llama.cpp's cvector-generator writes them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ClosedError, InvalidModelError, InvalidParameterError, ModelNotFoundError, check_ptr, native_error
from ..raw import ffi, lib
from . import _native_log
from ._handle import NativeHandle
from .gguf_header import inspect_model
from .model import LlamaModel


class LoraAdapter(NativeHandle):
    """A LoRA adapter loaded for one model; closed with it."""

    _what = "LoRA adapter"

    def __init__(self, model: LlamaModel, path: str | os.PathLike[str]):
        self.path = inspect_model(path).path  # a missing or non-GGUF file is named before llama.cpp sees it
        with _native_log.capture_errors() as errors:
            ptr = lib.llama_adapter_lora_init(model._ptr, str(self.path).encode())
        if not ptr:  # the message reads both files' architectures: only on failure
            theirs, ours = _architecture(self.path), model.metadata.get("general.architecture", "?")
            check_ptr(ptr, InvalidModelError, f"llama.cpp cannot use {self.path} (architecture {theirs}) as a "
                      f"LoRA adapter of {model.path.name} (architecture {ours})", errors)
        self._adopt(ptr, lib.llama_adapter_lora_free)
        model._dependents.add(self)
        self.model = model

    @classmethod
    def load(cls, model: LlamaModel, path: str | os.PathLike[str]) -> LoraAdapter:
        return cls(model, path)

    def __repr__(self) -> str:
        return f"<LoraAdapter {self.path.name}{' closed' if self.closed else ''}>"


def _architecture(path: Path) -> str:
    """general.architecture of a GGUF file, read without its tensors ("?" where there is none)."""
    params = ffi.new("struct gguf_init_params *", {"no_alloc": True, "ctx": ffi.NULL})
    gguf = lib.gguf_init_from_file(str(path).encode(), params[0])
    if gguf == ffi.NULL:
        return "?"
    try:
        key = lib.gguf_find_key(gguf, b"general.architecture")
        if key < 0 or lib.gguf_get_kv_type(gguf, key) != lib.GGUF_TYPE_STRING:
            return "?"
        return ffi.string(lib.gguf_get_val_str(gguf, key)).decode("utf-8", "replace")
    finally:
        lib.gguf_free(gguf)


class ControlVector:
    """Per-layer directions added to the hidden state: `data[i]` is layer i + 1's (shape (n_layer, n_embd))."""

    def __init__(self, data: Any):
        arr = np.ascontiguousarray(data, dtype=np.float32)
        if arr.ndim != 2 or not arr.size or not np.isfinite(arr).all():
            raise InvalidParameterError("a control vector is a finite (n_layers, n_embd) array", field="data")
        self.data = arr

    @classmethod
    def load(cls, path: str | os.PathLike[str], scale: float = 1.0) -> ControlVector:
        """Read direction.<layer> tensors from a GGUF (layers without one stay zero)."""
        source = Path(path)
        if not source.is_file():
            raise ModelNotFoundError(f"control vector file not found: {source}")
        inspect_model(source)
        holder = ffi.new("struct ggml_context **")
        params = ffi.new("struct gguf_init_params *", {"no_alloc": False, "ctx": holder})
        with _native_log.capture_errors() as errors:
            gguf = lib.gguf_init_from_file(str(source).encode(), params[0])
        check_ptr(gguf, InvalidModelError, f"cannot read control vector {source}", errors)
        try:
            layers: dict[int, np.ndarray] = {}
            for i in range(lib.gguf_get_n_tensors(gguf)):
                name = ffi.string(lib.gguf_get_tensor_name(gguf, i)).decode()
                prefix, _, layer = name.partition(".")
                if prefix != "direction" or not layer.isdigit() or int(layer) < 1:
                    continue
                tensor = lib.ggml_get_tensor(holder[0], name.encode())
                if tensor.type != lib.GGML_TYPE_F32 or lib.ggml_n_dims(tensor) != 1:
                    raise InvalidModelError(f"{source}: {name} must be a 1-dimensional F32 tensor")
                n = int(lib.ggml_nelements(tensor))
                layers[int(layer)] = np.frombuffer(ffi.buffer(tensor.data, 4 * n), dtype=np.float32).copy()
        finally:
            lib.gguf_free(gguf)
            if holder[0] != ffi.NULL:
                lib.ggml_free(holder[0])
        if not layers:
            raise InvalidModelError(f"{source} has no direction.<layer> tensors: not a control vector")
        widths = {v.size for v in layers.values()}
        if len(widths) != 1:
            raise InvalidModelError(f"{source}: the directions have different sizes {sorted(widths)}")
        data = np.zeros((max(layers), widths.pop()), dtype=np.float32)
        for layer, v in layers.items():
            data[layer - 1] = v * scale
        return cls(data)


class ContextAdapters(NativeHandle):
    """LlamaContext's adapter methods: the LoRA adapters applied with their scales, and the control vector.

    Mixed into LlamaContext (seed 004 spells these `ctx.set_lora(...)`); every change moves
    the context's `epoch`, since the KV cache it holds was computed without it.
    """

    model: LlamaModel
    epoch: int
    _loras: dict[LoraAdapter, float]  # set by the context; the order is the order applied
    _cvec: np.ndarray | None = None  # llama.cpp copies the vector; kept for inspection
    _cvec_layers: tuple[int, int] = (0, 0)

    def set_lora(self, adapter: LoraAdapter, scale: float = 1.0) -> None:
        """Apply `adapter` at `scale` (set again to change the scale; several adapters add up)."""
        self.epoch += 1
        if adapter.closed:
            raise ClosedError("this LoRA adapter is closed")
        if adapter.model is not self.model:
            raise InvalidParameterError(f"{adapter.path.name} was loaded for {adapter.model.path.name}, not for "
                                        f"this context's {self.model.path.name}", field="adapter")
        self._loras[adapter] = check_scale(scale)
        self._apply_loras()

    def remove_lora(self, adapter: LoraAdapter) -> None:
        self.epoch += 1
        if self._loras.pop(adapter, None) is None:
            raise InvalidParameterError("that LoRA adapter is not applied to this context", field="adapter")
        self._apply_loras()

    def clear_loras(self) -> None:
        self.epoch += 1
        self._loras.clear()
        self._apply_loras()

    @property
    def loras(self) -> dict[LoraAdapter, float]:
        return dict(self._loras)

    @property
    def control_vector(self) -> tuple[np.ndarray, int, int] | None:
        """The control vector applied (its data, first and last layer), None without one."""
        return None if self._cvec is None else (self._cvec, *self._cvec_layers)

    def _apply_loras(self) -> None:
        live = {a: s for a, s in self._loras.items() if not a.closed}
        self._loras = live
        adapters = ffi.new("struct llama_adapter_lora *[]", [a._ptr for a in live]) if live else ffi.NULL
        scales = ffi.new("float[]", list(live.values())) if live else ffi.NULL
        with _native_log.capture_errors() as errors:
            rc = lib.llama_set_adapters_lora(self._ptr, adapters, len(live), scales)
        if rc != 0:
            raise native_error(InvalidParameterError, f"llama.cpp refused the LoRA adapters (code {rc})", errors,
                               field="lora")

    def apply_control_vector(self, vector: ControlVector | Any | None, layer_start: int = 1,
                             layer_end: int | None = None) -> None:
        """Add `vector` (a ControlVector, or an (n_layers, n_embd) array from layer 1) to layers
        layer_start..layer_end (inclusive; default: all it has); None removes it."""
        self.epoch += 1
        if vector is None:
            lib.llama_set_adapter_cvec(self._ptr, ffi.NULL, 0, self.model.n_embd, 0, 0)
            self._cvec = None
            return
        data = (vector if isinstance(vector, ControlVector) else ControlVector(vector)).data
        n_layers, n_embd = data.shape
        if n_embd != self.model.n_embd:
            raise InvalidParameterError(f"the control vector has {n_embd} values a layer, {self.model.path.name} "
                                        f"has n_embd={self.model.n_embd}", field="vector")
        end = n_layers if layer_end is None else layer_end
        if not 1 <= layer_start <= end <= min(n_layers, self.model.n_layer):
            top = min(n_layers, self.model.n_layer)
            raise InvalidParameterError(f"layers {layer_start}..{end} are outside 1..{top} (the vector's and the "
                                        "model's layers)", field="layer_start")
        with _native_log.capture_errors() as errors:
            rc = lib.llama_set_adapter_cvec(self._ptr, ffi.from_buffer("float[]", data), data.size, n_embd,
                                            layer_start, end)
        if rc != 0:
            raise native_error(InvalidParameterError, "llama.cpp refused the control vector", errors,
                               field="vector")
        self._cvec, self._cvec_layers = data, (layer_start, end)


def check_scale(scale: Any) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not np.isfinite(scale):
        raise InvalidParameterError(f"a LoRA scale is a finite number, got {scale!r}", field="scale")
    return float(scale)
