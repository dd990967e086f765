"""What a GGUF model file is, in the few words model lists show: family, size in parameters, quantization, bytes, date.

Read from the file's header (no model loaded: blocks.gguf_info), and kept per path and
modification time, for Ollama's /api/tags, /api/show and /api/ps and `llamaplug list` / `show`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
from pathlib import Path
from typing import Any

from ..blocks.gguf_info import GgufInfo, read_gguf_info
from ..blocks.quantize import QUANT_TYPES
from .hub import SPLIT_GGUF

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """One GGUF model file (a split model: its first part) as model lists describe it."""

    path: Path
    size: int  # bytes, every part of a split model
    modified: float  # the file's modification time (seconds since the epoch)
    digest: str  # sha256 hex: the Hub's blob name where the file is a Hub cache blob, else of path, size and date
    family: str  # general.architecture
    parameter_count: int
    quantization: str  # llama-quantize's name of general.file_type ("Q8_0", "Q4_K_M", "F16", ...)
    context_length: int | None
    embedding_length: int | None
    info: GgufInfo = dataclasses.field(repr=False)

    @property
    def parameter_size(self) -> str:
        """The parameter count as Ollama writes it ("135M", "7.6B")."""
        return human_number(self.parameter_count)

    @property
    def chat_template(self) -> str | None:
        return self.info.chat_templates().get("default")

    def capabilities(self, multimodal: bool = False) -> list[str]:
        """What the model can do, in Ollama's words and by its rules (server/images.go, Model.Capabilities): a
        model with a pooling type embeds, any other completes; tools, thinking from its chat template; insert
        from its fill-in-the-middle tokens (a GGUF's, where Ollama reads its own template's `.Suffix`); vision
        with a projector (`multimodal`) or a vision tower in the file."""
        keys = self.info.metadata
        template = self.chat_template or ""
        found = ["embedding" if f"{self.family}.pooling_type" in keys else "completion"]
        if "tools" in template:
            found.append("tools")
        if "tokenizer.ggml.fim_pre_token_id" in keys and "tokenizer.ggml.fim_suf_token_id" in keys:
            found.append("insert")
        if multimodal or any(k.startswith(f"{self.family}.vision.") for k in keys):
            found.append("vision")
        if any(word in template for word in ("<think>", "enable_thinking", "reasoning_content", "thinking")):
            found.append("thinking")
        return found

    def metadata(self, arrays: bool = False) -> dict[str, Any]:
        """The GGUF's key/values as plain JSON values; an array is [] unless `arrays` (Ollama's show, not verbose)."""
        out: dict[str, Any] = {}
        for key, value in self.info.metadata.items():
            if value.type == "array":
                out[key] = list(value.value or ()) if arrays else []
            else:
                out[key] = value.value
        return out


def card(path: str | os.PathLike[str]) -> ModelCard:
    """The card of the GGUF at `path` (ModelNotFoundError / InvalidModelError as loading it would raise)."""
    p = Path(path)
    stat = p.stat() if p.exists() else None
    return _card(str(p), stat.st_mtime_ns if stat else 0)


@functools.lru_cache(maxsize=64)
def _card(path: str, mtime_ns: int) -> ModelCard:
    info = read_gguf_info(path)
    md = info.metadata

    def number(key: str) -> int | None:
        value = md.get(key)
        return value.value if value is not None and isinstance(value.value, int) else None

    arch_value = md.get("general.architecture")
    arch = str(arch_value.value) if arch_value is not None else "unknown"
    p = Path(path)
    parts = split_parts(p)
    return ModelCard(
        path=p, size=sum(q.stat().st_size for q in parts), modified=p.stat().st_mtime, digest=_digest(p),
        family=arch, parameter_count=info.n_parameters, quantization=_quantization(info),
        context_length=number(f"{arch}.context_length"), embedding_length=number(f"{arch}.embedding_length"),
        info=info)


def split_parts(path: Path) -> list[Path]:
    """Every part of the split model whose first part is `path` (`path` alone if it is not split)."""
    found = SPLIT_GGUF.match(path.name)
    if found is None:
        return [path]
    count = int(found["count"])
    parts = [path.with_name(f"{found['prefix']}-{i:05d}-of-{found['count']}.gguf") for i in range(1, count + 1)]
    return [q for q in parts if q.exists()]


def _digest(path: Path) -> str:
    # A Hub cache snapshot links each file to its blob, named by the file's sha256 (LFS files): the real digest,
    # for free. Elsewhere hashing a model of gigabytes to list it would take seconds: a digest of where and what.
    blob = path.resolve().name
    if _SHA256.match(blob):
        return blob
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()


_FTYPE_NAMES: dict[int, str] = {}
for _name, _ftype in QUANT_TYPES.items():
    if len(_name) > len(_FTYPE_NAMES.get(_ftype, "")):  # the full name: Q4_K_M rather than its alias Q4_K
        _FTYPE_NAMES[_ftype] = _name


def _quantization(info: GgufInfo) -> str:
    ftype = info.metadata.get("general.file_type")
    if ftype is not None and isinstance(ftype.value, int) and ftype.value in _FTYPE_NAMES:
        return _FTYPE_NAMES[ftype.value]
    by_type = info.by_type()  # no file type: the type holding the most bytes
    return next(iter(by_type)).upper() if by_type else "unknown"


def human_number(n: int) -> str:
    """`n` as Ollama's format.HumanNumber writes it: 7.6B, 135M (two decimals below a billion), 12K."""
    if n >= 1_000_000_000:
        value = n / 1_000_000_000
        return f"{value:.0f}B" if value == int(value) else f"{value:.1f}B"
    if n >= 1_000_000:
        value = n / 1_000_000
        return f"{value:.0f}M" if value == int(value) else f"{value:.2f}M"
    if n >= 1000:
        return f"{n / 1000:.0f}K"
    return str(n)
