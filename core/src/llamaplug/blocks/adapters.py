"""Adapters: LoRA adapters and control vectors, applied to a context without reloading the model.

    lora = LoraAdapter.load(model, "style.gguf")
    ctx.set_lora(lora, 0.8)          # several at once, each with its scale; change it between calls
    ctx.remove_lora(lora)
    ctx.apply_control_vector(ControlVector.load("happy.gguf"), 10, 20)

An adapter made for another model (architecture, tensor shapes) is an InvalidModelError
with llama.cpp's reason. Control vector files are GGUFs with one `direction.<layer>`
tensor of n_embd floats per layer, as llama.cpp's cvector-generator writes them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidModelError, InvalidParameterError, ModelNotFoundError, native_error
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
        if ptr == ffi.NULL:
            theirs, ours = _architecture(self.path), model.metadata.get("general.architecture", "?")
            raise native_error(InvalidModelError, f"llama.cpp cannot use {self.path} (architecture {theirs}) as a "
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
        if gguf == ffi.NULL:
            raise native_error(InvalidModelError, f"cannot read control vector {source}", errors)
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


class AdapterState:
    """What a context has applied: LoRA adapters with their scales, and the control vector."""

    def __init__(self) -> None:
        self.loras: dict[LoraAdapter, float] = {}

    def apply_loras(self, ctx_ptr: Any) -> None:
        live = {a: s for a, s in self.loras.items() if not a.closed}
        self.loras = live
        adapters = ffi.new("struct llama_adapter_lora *[]", [a._ptr for a in live]) if live else ffi.NULL
        scales = ffi.new("float[]", list(live.values())) if live else ffi.NULL
        rc = lib.llama_set_adapters_lora(ctx_ptr, adapters, len(live), scales)
        if rc != 0:
            raise InvalidParameterError(f"llama.cpp refused the LoRA adapters (code {rc})", field="lora")


def check_scale(scale: Any) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not np.isfinite(scale):
        raise InvalidParameterError(f"a LoRA scale is a finite number, got {scale!r}", field="scale")
    return float(scale)
