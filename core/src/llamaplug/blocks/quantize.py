"""Quantize a GGUF model with llama_model_quantize, as llama-quantize does.

The output is written to a temporary file in the destination's folder and renamed when
llama.cpp reports success, so a failed or interrupted run leaves no half-written file.
Progress comes from llama.cpp's own per-tensor log lines ("[  12/ 272] blk.1.attn_q.weight ...").
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import InvalidParameterError, QuantizeError, native_error
from ..raw import ffi, lib
from . import _callback_errors, _native_log
from .backend import LlamaBackend
from .gguf_header import inspect_model
from .imatrix import ImportanceMatrix, load_imatrix

log = logging.getLogger("llamaplug.quantize")

# The names llama-quantize accepts (tools/quantize/quantize.cpp, QUANT_OPTIONS), in its order, with the
# llama_ftype each stands for. Q3_K, Q4_K, Q5_K are its aliases; COPY copies the tensors unchanged.
_NAMES = (
    ("Q1_0", "Q1_0"), ("Q2_0", "Q2_0"), ("Q4_0", "Q4_0"), ("Q4_1", "Q4_1"), ("MXFP4_MOE", "MXFP4_MOE"),
    ("Q5_0", "Q5_0"), ("Q5_1", "Q5_1"), ("IQ2_XXS", "IQ2_XXS"), ("IQ2_XS", "IQ2_XS"), ("IQ2_S", "IQ2_S"),
    ("IQ2_M", "IQ2_M"), ("IQ1_S", "IQ1_S"), ("IQ1_M", "IQ1_M"), ("TQ1_0", "TQ1_0"), ("TQ2_0", "TQ2_0"),
    ("Q2_K", "Q2_K"), ("Q2_K_S", "Q2_K_S"), ("IQ3_XXS", "IQ3_XXS"), ("IQ3_S", "IQ3_S"), ("IQ3_M", "IQ3_M"),
    ("Q3_K", "Q3_K_M"), ("IQ3_XS", "IQ3_XS"), ("Q3_K_S", "Q3_K_S"), ("Q3_K_M", "Q3_K_M"), ("Q3_K_L", "Q3_K_L"),
    ("IQ4_NL", "IQ4_NL"), ("IQ4_XS", "IQ4_XS"), ("Q4_K", "Q4_K_M"), ("Q4_K_S", "Q4_K_S"), ("Q4_K_M", "Q4_K_M"),
    ("Q5_K", "Q5_K_M"), ("Q5_K_S", "Q5_K_S"), ("Q5_K_M", "Q5_K_M"), ("Q6_K", "Q6_K"), ("Q8_0", "Q8_0"),
    ("F16", "F16"), ("BF16", "BF16"), ("F32", None), ("COPY", None),
)


def _ftype(suffix: str | None) -> int:
    return int(lib.LLAMA_FTYPE_ALL_F32 if suffix is None else getattr(lib, f"LLAMA_FTYPE_MOSTLY_{suffix}"))


QUANT_TYPES: dict[str, int] = {name: _ftype(suffix) for name, suffix in _NAMES}
"""Every type name `quantize` takes (llama-quantize's), to its llama_ftype."""

_TENSOR_LINE = re.compile(r"\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")

ProgressFn = Callable[[int, int, str], Any]


def quant_type(name: str | int) -> tuple[str, int]:
    """(canonical name, llama_ftype) for a type name, case-insensitive, or a llama_ftype number, as llama-quantize
    reads them; anything else is an InvalidParameterError listing the valid names."""
    text = str(name).strip().upper()
    if text in QUANT_TYPES:
        return text, QUANT_TYPES[text]
    if text.lstrip("-").isdigit():
        for known, ftype in QUANT_TYPES.items():
            if ftype == int(text):
                return known, ftype
    raise InvalidParameterError(f"unknown quantization type {name!r}; valid types: {', '.join(QUANT_TYPES)}",
                                field="type")


def ftype_name(ftype: int) -> str:
    """llama.cpp's description of a llama_ftype ("Q4_K - Medium")."""
    return ffi.string(lib.llama_ftype_name(ftype)).decode()


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], type: str | int = "Q4_K_M", *,
             imatrix: str | os.PathLike[str] | ImportanceMatrix | None = None, threads: int = 0,
             allow_requantize: bool = False, leave_output_tensor: bool = False, pure: bool = False,
             quiet: bool = False, progress: ProgressFn | None = None) -> Path:
    """Quantize the GGUF model `src` into `dst` as `type` (a llama-quantize name: "Q4_K_M", "Q8_0", "IQ4_NL", ...).

    `imatrix`: an importance matrix file (llama-imatrix's GGUF or legacy output), needed by the lowest-bit
    types (IQ1_*, IQ2_*, IQ3_XXS, Q2_K_S: llama.cpp refuses them without one). `threads`: 0 = every
    hardware thread. `allow_requantize`: accept an already quantized `src` (quality suffers).
    `progress(done, total, tensor_name)` is called per tensor; without it a tqdm bar per tensor is
    shown on stderr unless `quiet`. Returns the path of the written file.
    """
    name, ftype = quant_type(type)
    header = inspect_model(src)  # ModelNotFoundError / InvalidModelError, as loading it would
    source = header.path
    target = Path(dst)
    if target.is_dir():
        raise InvalidParameterError(f"dst {target} is a folder; give the output file's path", field="dst")
    if not target.parent.is_dir():
        raise InvalidParameterError(f"dst {target}: folder {target.parent} does not exist", field="dst")
    if target.exists() and target.resolve() == source.resolve():
        raise InvalidParameterError(f"dst {target} is the input file; give another path", field="dst")
    if threads < 0:
        raise InvalidParameterError(f"threads must be >= 0 (0 = all), got {threads}", field="threads")
    matrix = load_imatrix(imatrix) if imatrix is not None and not isinstance(imatrix, ImportanceMatrix) else imatrix
    LlamaBackend.init()

    c = ffi.new("llama_model_quantize_params *", lib.llama_model_quantize_default_params())
    c.nthread = threads
    c.ftype = ftype
    c.allow_requantize = allow_requantize
    c.quantize_output_tensor = not leave_output_tensor
    c.pure = pure
    c.only_copy = name == "COPY"
    keep = _attach_imatrix(c, matrix) if matrix is not None and matrix.entries else []

    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    os.close(fd)
    done = False
    try:
        with _progress(progress, quiet, f"{name} {target.name}") as on_log, _native_log.listen(on_log), \
                _native_log.capture_errors() as errors:
            rc = lib.llama_model_quantize(str(source).encode(), tmp.encode(), c)
        del keep
        _callback_errors.raise_stored()
        if rc != 0:
            said = [_unframe(line) for line in errors]
            raise native_error(QuantizeError, f"llama.cpp could not quantize {source} to {name}", said,
                               _hint(name, said))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 is for the partial file; the result is an ordinary one
        os.replace(tmp, target)
        done = True
    finally:
        if not done:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    log.info("quantized %s to %s as %s", source, target, name)
    return target


def _unframe(message: str) -> str:
    """One line of a boxed multi-line llama.cpp message (its ==== rules dropped)."""
    return " ".join(part.strip() for part in message.splitlines() if part.strip(" =\t"))


def _hint(name: str, errors: list[str]) -> str:
    said = " ".join(errors)
    if "requantiz" in said:
        return "the input is already quantized: pass allow_requantize=True (--allow-requantize), or start from F16/F32"
    if "imatrix" in said or "importance matrix" in said:
        return f"{name} needs an importance matrix: pass imatrix=FILE (--imatrix FILE) from llama-imatrix"
    return ""


def _attach_imatrix(c: Any, matrix: ImportanceMatrix) -> list[Any]:
    """Point `c` at the imatrix data and add the quantize.imatrix.* keys llama-quantize writes; returns what
    must stay alive until llama_model_quantize returns."""
    keep: list[Any] = []
    rows = ffi.new("struct llama_model_imatrix_data[]", len(matrix.entries) + 1)
    for row, (key, values) in zip(rows, matrix.entries.items()):
        name = ffi.new("char[]", key.encode())
        data = ffi.from_buffer("float[]", values)
        keep += [name, data, values]
        row.name, row.data, row.size = name, data, len(values)
    c.imatrix = rows
    keys: list[tuple[str, str | int]] = [("quantize.imatrix.file", matrix.path)]
    if matrix.datasets:
        keys.append(("quantize.imatrix.dataset", matrix.datasets[0]))
    keys.append(("quantize.imatrix.entries_count", len(matrix.entries)))
    if matrix.chunk_count > 0:
        keys.append(("quantize.imatrix.chunks_count", matrix.chunk_count))
    overrides = ffi.new("struct llama_model_kv_override[]", len(keys) + 1)  # zeroed: the last ends the list
    for kv, (key, value) in zip(overrides, keys):
        kv.key = key.encode()
        if isinstance(value, str):
            kv.tag = lib.LLAMA_KV_OVERRIDE_TYPE_STR
            kv.val_str = value.encode()[:127]  # llama-quantize keeps 127 bytes
        else:
            kv.tag = lib.LLAMA_KV_OVERRIDE_TYPE_INT
            kv.val_i64 = value
    c.kv_overrides = overrides
    return keep + [rows, overrides]


@contextlib.contextmanager
def _progress(progress: ProgressFn | None, quiet: bool, desc: str) -> Iterator[Callable[[int, str], None]]:
    bar = None
    if progress is None and not quiet:
        from tqdm import tqdm

        bar = tqdm(desc=f"quantizing {desc}", unit="tensor", leave=False)

    def on_log(level: int, text: str) -> None:  # noqa: ARG001 - _native_log.listen's signature
        found = _TENSOR_LINE.match(text)
        if found is None:
            return
        n, total, tensor = int(found[1]), int(found[2]), found[3]
        if bar is not None:
            bar.total = total
            bar.set_postfix_str(tensor, refresh=False)
            bar.update(n - bar.n)
            if n == total:
                bar.refresh()  # tqdm draws at most every 0.1 s: show the last tensor before the bar goes
        if progress is not None:
            progress(n, total, tensor)

    try:
        yield on_log
    finally:
        if bar is not None:
            bar.close()
