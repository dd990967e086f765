"""Llama.save_state / load_state: the KV cache and the slots' tokens, tied to the model that made them.

Layout: b"LLPS", a uint32 header length, the header (JSON: format version, the
model's identity, the context's shape, each slot's tokens), then llama.cpp's own
state bytes. llama.cpp checks only sizes when it reads a state, so a state of
another model with the same shapes would load as garbage: the identity (file
fingerprint, architecture, sizes) is checked first, and a mismatch names what differs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import StateError

if TYPE_CHECKING:
    from ..blocks.model import LlamaModel
    from .llama import Llama

MAGIC = b"LLPS"
VERSION = 1
_EDGE = 1 << 20  # bytes hashed at each end of the model file: the header and the last tensors


def identity(model: LlamaModel) -> dict[str, Any]:
    """What tells this model from another (fine-tunes of one architecture included)."""
    path = Path(model.path)
    digest = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as fh:
        digest.update(fh.read(_EDGE))
        fh.seek(max(0, size - _EDGE))
        digest.update(fh.read(_EDGE))
    return {"file": path.name, "file_size": size, "fingerprint": digest.hexdigest(), "desc": model.desc,
            "n_params": model.n_params, "n_vocab": model.n_vocab, "n_embd": model.n_embd}


def pack(llama: Llama, slots: list[list[int]], native: bytes) -> bytes:
    ctx = llama.context
    head = json.dumps({"version": VERSION, "model": identity(llama.model),
                       "n_ctx": ctx.n_ctx, "n_seq_max": ctx.n_seq_max, "slots": slots}).encode()
    return MAGIC + len(head).to_bytes(4, "little") + head + native


def unpack(llama: Llama, data: bytes | bytearray | memoryview | str | os.PathLike[str]) -> tuple[list[list[int]],
                                                                                                  bytes]:
    """The slots' tokens and llama.cpp's state, once the state is known to fit this Llama."""
    where = "the state"
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if not path.is_file():
            raise StateError(f"state file not found: {path}")
        where, data = f"state file {path}", path.read_bytes()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise StateError("a state is bytes from save_state() or the path of a file it wrote")
    raw = bytes(data)
    if raw[:4] != MAGIC or len(raw) < 8:
        raise StateError(f"{where} is not a llamaplug state (it does not start with {MAGIC!r})")
    n = int.from_bytes(raw[4:8], "little")
    try:
        head = json.loads(raw[8:8 + n])
        saved, slots = head["model"], head["slots"]
        version, n_ctx, n_seq_max = head["version"], head["n_ctx"], head["n_seq_max"]
    except (ValueError, KeyError, TypeError):
        raise StateError(f"{where} has a damaged header") from None
    if version != VERSION:
        raise StateError(f"{where} has format version {version}; this llamaplug reads {VERSION}")
    mine = identity(llama.model)
    differ = [k for k in mine if saved.get(k) != mine[k]]
    if differ:
        raise StateError(f"{where} was saved with another model: {saved.get('file')} ({saved.get('desc')}), not "
                         f"{mine['file']} ({mine['desc']}); differs in {', '.join(differ)}")
    ctx = llama.context
    if (n_ctx, n_seq_max) != (ctx.n_ctx, ctx.n_seq_max):
        raise StateError(f"{where} is of a context with n_ctx={n_ctx}, n_seq_max={n_seq_max}; this one has "
                         f"n_ctx={ctx.n_ctx}, n_seq_max={ctx.n_seq_max}")
    if (not isinstance(slots, list) or len(slots) != n_seq_max
            or not all(isinstance(s, list) and all(isinstance(t, int) for t in s) for s in slots)):
        raise StateError(f"{where} has a damaged header (slots)")
    native = raw[8 + n:]
    if not native:
        raise StateError(f"{where} is cut short: no KV cache after the header")
    return slots, native
