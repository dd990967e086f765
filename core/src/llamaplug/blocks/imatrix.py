"""Importance matrices (llama-imatrix's output) read for quantization, as llama-quantize reads them.

Two formats: the GGUF one (per tensor `NAME.in_sum2` and `NAME.counts`, F32; metadata
imatrix.datasets / chunk_count / chunk_size) and the legacy binary one. The values handed to
llama_model_quantize are the sums divided by their counts, per expert, in float32 as llama.cpp does.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import InvalidModelError, InvalidParameterError, ModelNotFoundError
from .gguf_header import GGUF_MAGIC
from .gguf_info import read_gguf_info


@dataclasses.dataclass(frozen=True)
class ImportanceMatrix:
    """Per-tensor importance values (`entries`, float32) with what the file says about how they were made."""

    path: str
    entries: dict[str, np.ndarray]
    datasets: tuple[str, ...]
    chunk_count: int


def _bad(path: str, why: str) -> InvalidParameterError:
    return InvalidParameterError(f"imatrix {path}: {why}", field="imatrix")


def _lround(values: np.ndarray) -> np.ndarray:
    # C's lround: halves away from zero (numpy rounds them to even).
    return (np.sign(values) * np.floor(np.abs(values.astype(np.float64)) + 0.5)).astype(np.int64)


def load_imatrix(path: str | os.PathLike[str]) -> ImportanceMatrix:
    """Read an imatrix file (GGUF or legacy); a file that is neither, or lacks data, is an InvalidParameterError."""
    name = os.fspath(path)
    p = Path(name)
    if not p.is_file():
        raise _bad(name, "no such file" if not p.exists() else "not a file")
    try:
        with p.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise _bad(name, f"cannot read it: {exc.strerror}") from None
    return _load_gguf(name, p) if magic == GGUF_MAGIC else _load_legacy(name, p)


def _load_gguf(name: str, p: Path) -> ImportanceMatrix:
    try:
        info = read_gguf_info(p)
    except (InvalidModelError, ModelNotFoundError) as exc:
        raise _bad(name, str(exc)) from None
    meta = info.metadata
    # llama-quantize refuses a GGUF imatrix without its metadata.
    missing = [k for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size") if k not in meta]
    if missing:
        raise _bad(name, f"missing imatrix metadata ({', '.join(missing)})")
    if not info.tensors:
        raise _bad(name, "no data")
    datasets = meta["imatrix.datasets"]
    names = tuple(datasets.value or ()) if datasets.element_type == "string" else ()
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, np.ndarray] = {}
    with p.open("rb") as fh:
        for t in info.tensors:
            for suffix, into in ((".in_sum2", sums), (".counts", counts)):
                if t.name.endswith(suffix) and len(t.name) > len(suffix):
                    if t.type != "F32":
                        raise _bad(name, f"sums and counts for {t.name[:-len(suffix)]} must be F32, not {t.type}")
                    fh.seek(t.offset)
                    into[t.name[:-len(suffix)]] = np.frombuffer(fh.read(t.n_bytes), dtype=np.float32)
    entries = {}
    for key in sorted(sums.keys() | counts.keys()):
        if key not in sums or key not in counts:
            raise _bad(name, f"mismatched sums and counts for {key}")
        n = _lround(counts[key]).astype(np.float32)
        per = sums[key].reshape(len(n), -1)
        with np.errstate(divide="ignore", invalid="ignore"):
            values = np.where(n[:, None] > 0, per / np.where(n > 0, n, 1)[:, None], np.float32(1))
        entries[key] = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    return ImportanceMatrix(name, entries, names, int(meta["imatrix.chunk_count"].value))


def _load_legacy(name: str, p: Path) -> ImportanceMatrix:
    data = p.read_bytes()
    pos = 0

    def take(fmt: str) -> tuple:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise _bad(name, "truncated (neither a GGUF nor a complete legacy imatrix)")
        out = struct.unpack_from(fmt, data, pos)
        pos += size
        return out

    (n_entries,) = take("<i")
    if n_entries < 1:
        raise _bad(name, "no data (neither a GGUF nor a legacy imatrix)")
    entries = {}
    for _ in range(n_entries):
        (length,) = take("<i")
        if length < 0:
            raise _bad(name, "bad entry name length")
        (raw,) = take(f"<{length}s")
        ncall, nval = take("<ii")
        if nval < 1:
            raise _bad(name, "bad number of values")
        sums = np.frombuffer(take(f"<{4 * nval}s")[0], dtype=np.float32)
        key = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        entries[key] = (sums / np.float32(ncall)).astype(np.float32) if ncall > 0 else sums.copy()
    chunk_count, datasets = 0, ()
    if pos + 4 <= len(data):
        (chunk_count,) = take("<i")
        if pos + 4 <= len(data):
            (length,) = take("<i")
            if length > 0 and pos + length <= len(data):
                datasets = (data[pos:pos + length].split(b"\0", 1)[0].decode("utf-8", "replace"),)
    return ImportanceMatrix(name, entries, datasets, chunk_count)
