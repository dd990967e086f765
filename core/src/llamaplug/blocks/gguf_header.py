"""A minimal GGUF header check, run before llama.cpp sees a file.

llama.cpp's own reader reports most malformed files, but it trusts the
header's counts when it allocates; this refuses files whose header cannot be
right for their size, with a message naming the file and the field.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from ..errors import InvalidModelError, ModelNotFoundError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
HEADER = struct.Struct("<4sIQQ")  # magic, version, n_tensors, n_kv
# The smallest possible tensor-info and key/value entries (an empty name, no dims).
MIN_TENSOR_INFO = 8 + 4 + 4 + 8
MIN_KV = 8 + 4 + 1


def check_model_path(path: str | os.PathLike[str]) -> Path:
    """Return the path if it looks like a GGUF file; raise ModelNotFoundError / InvalidModelError if not."""
    p = Path(path)
    if not p.exists():
        raise ModelNotFoundError(f"model file not found: {p}")
    if p.is_dir():
        raise InvalidModelError(f"model path is a directory, not a GGUF file: {p}")
    try:
        size = p.stat().st_size
        with p.open("rb") as fh:
            head = fh.read(HEADER.size)
    except OSError as exc:
        raise InvalidModelError(f"cannot read model file {p}: {exc.strerror}") from None
    if size == 0:
        raise InvalidModelError(f"model file is empty: {p}")
    if len(head) < 4 or head[:4] != GGUF_MAGIC:
        raise InvalidModelError(f"not a GGUF file (magic {head[:4]!r}, expected {GGUF_MAGIC!r}): {p}")
    if len(head) < HEADER.size:
        raise InvalidModelError(f"GGUF file truncated inside its header ({size} bytes): {p}")
    _, version, n_tensors, n_kv = HEADER.unpack(head)
    if version not in SUPPORTED_VERSIONS:
        raise InvalidModelError(f"unsupported GGUF version {version} (supported: {SUPPORTED_VERSIONS}): {p}")
    room = size - HEADER.size
    if n_kv * MIN_KV > room:
        raise InvalidModelError(f"GGUF header claims {n_kv} metadata entries, more than {size} bytes can hold: {p}")
    if n_tensors * MIN_TENSOR_INFO > room:
        raise InvalidModelError(f"GGUF header claims {n_tensors} tensors, more than {size} bytes can hold: {p}")
    return p
