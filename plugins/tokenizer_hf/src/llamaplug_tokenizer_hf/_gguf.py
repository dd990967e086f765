"""The tokenizer.* metadata of a GGUF file, read straight from its header (only the key/value section)."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np

from llamaplug.errors import InvalidModelError

# gguf_type ids -> (struct code, size); 8 = string, 9 = array
_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4), 7: ("?", 1),
            10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
          12: "<f8"}


def read_tokenizer_kv(path: str | Path) -> dict[str, Any]:
    """Every `tokenizer.*` key of `path` (string arrays as lists of bytes, numeric arrays as numpy arrays)."""
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(buf, path)
    except (OSError, ValueError) as exc:
        raise InvalidModelError(f"cannot read the GGUF header of {path}: {exc}") from None


def _parse(buf: Any, path: Path) -> dict[str, Any]:
    if buf[:4] != b"GGUF":
        raise InvalidModelError(f"{path} is not a GGUF file (magic {bytes(buf[:4])!r})")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version < 2:
        raise InvalidModelError(f"{path}: GGUF version {version} is not supported")
    pos = 24
    size = len(buf)

    def string() -> bytes:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", buf, pos)
        if pos + 8 + n > size:
            raise InvalidModelError(f"{path}: a string at byte {pos} runs past the end of the file")
        s = buf[pos + 8:pos + 8 + n]
        pos += 8 + n
        return s

    def value(kind: int, keep: bool) -> Any:
        nonlocal pos
        if kind == 8:
            return string()
        if kind == 9:
            (sub, n) = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if sub == 8:
                out = []
                for _ in range(n):
                    out.append(string())
                return out if keep else None
            if sub not in _NUMPY:
                raise InvalidModelError(f"{path}: unknown GGUF array type {sub} at byte {pos}")
            width = _SCALARS[sub][1]
            arr = np.frombuffer(buf, dtype=_NUMPY[sub], count=n, offset=pos).copy() if keep else None
            pos += n * width
            return arr
        if kind not in _SCALARS:
            raise InvalidModelError(f"{path}: unknown GGUF value type {kind} at byte {pos}")
        code, width = _SCALARS[kind]
        (v,) = struct.unpack_from("<" + code, buf, pos)
        pos += width
        return v

    out: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string().decode("utf-8", "replace")
        (kind,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        keep = key.startswith("tokenizer.") and key != "tokenizer.chat_template"
        v = value(kind, keep)
        if keep:
            out[key] = v
    return out
