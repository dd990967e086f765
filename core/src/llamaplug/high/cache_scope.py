"""What a prompt cache's KV bytes are valid for: the model, and every setting that changes the KV contents.

The disk tier (disk_store.py) seeds its file names with this scope and keeps it in each file's
header, so two models or two KV settings sharing a cache directory never read each other's files.

- the model: by its contents, not its path (a copy elsewhere is the same model; a file replaced at
  the same path is not): the file size, its whole GGUF header (metadata and tensor infos) and 16
  samples of 4 KiB spread over the tensor data (two fine-tunes with one header differ there);
- the context's settings that change what a cell holds: KV cache types, flash attention (the V
  layout), RoPE/YaRN settings (and whether a sequence reaches past the original context, which
  LongRoPE models read), swa_full, embeddings mode, attention type, and n_ubatch (measured: SmolLM2
  on the CPU writes other KV bytes for one prompt read with n_ubatch 512 and 16, rounding);
- the adapters applied now: each LoRA's identity (as the model's) and scale, the control vector's
  values and layers. They change at run time, so the scope is asked again at each lookup and write.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..blocks.context import LlamaContext

_SAMPLES, _SAMPLE = 16, 4096
_HEADER_MAX = 64 << 20  # a header past this (no model has one) is hashed up to here
_identities: dict[tuple[str, int, int], str] = {}


def file_identity(path: str | os.PathLike[str]) -> str:
    """A digest of a GGUF file's contents (size, header, samples of the tensor data); cached by path, size, mtime."""
    from ..blocks.gguf_header import inspect_model

    p = Path(path)
    st = p.stat()
    memo = (str(p), st.st_size, st.st_mtime_ns)
    found = _identities.get(memo)
    if found is not None:
        return found
    offset = inspect_model(p).data_offset
    head = min(offset if offset is not None else 8 << 20, st.st_size, _HEADER_MAX)
    h = hashlib.sha256(st.st_size.to_bytes(8, "little"))
    with p.open("rb") as fh:
        h.update(fh.read(head))
        span = st.st_size - head
        for i in range(_SAMPLES if span > 0 else 0):
            fh.seek(head + span * i // _SAMPLES)
            h.update(fh.read(_SAMPLE))
    _identities[memo] = digest = h.hexdigest()
    return digest


def _value(v: Any) -> Any:
    return getattr(v, "name", v)  # enums by name: stable across releases


def describe(context: LlamaContext) -> dict[str, Any]:
    """The scope as plain data (kept in each file's header, for `llamaplug cache list`)."""
    p = context.params
    orig = p.yarn_orig_ctx or context.model.n_ctx_train
    cvec = context.control_vector
    return {
        "model": file_identity(context.model.path),
        "model_name": context.model.path.name,  # shown only: the identity above is what matches
        "type_k": _value(p.type_k), "type_v": _value(p.type_v), "flash_attn": _value(p.flash_attn_type),
        "rope_scaling_type": _value(p.rope_scaling_type), "rope_freq_base": p.rope_freq_base,
        "rope_freq_scale": p.rope_freq_scale, "yarn": [p.yarn_ext_factor, p.yarn_attn_factor, p.yarn_beta_fast,
                                                        p.yarn_beta_slow, p.yarn_orig_ctx],
        "past_orig_ctx": context.n_ctx_seq > orig > 0,
        "swa_full": p.swa_full, "embeddings": p.embeddings, "attention_type": _value(p.attention_type),
        "n_ubatch": context.n_ubatch,
        "lora": [[file_identity(a.path), scale] for a, scale in context.loras.items()],
        "control_vector": None if cvec is None else [hashlib.sha256(cvec[0].tobytes()).hexdigest(), *cvec[1:]],
    }


def scope_digest(description: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps({k: v for k, v in description.items() if k != "model_name"},
                                     sort_keys=True).encode()).hexdigest()
