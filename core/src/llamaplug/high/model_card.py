"""What a GGUF model file is, in the few words model lists show: family, size in parameters, quantization, bytes, date.

Read from the file's header (no model loaded: blocks.gguf_info), and kept per path and
modification time, for Ollama's /api/tags, /api/show and /api/ps and `llamaplug list` / `show`.
A card's `digest` is the file's sha256 (Ollama's digest), hashed once per path, size and modification
time: `hash_in_background` starts it early for a file too big to hash while a client waits.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import threading
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
    family: str  # general.architecture
    parameter_count: int
    quantization: str  # llama-quantize's name of general.file_type ("Q8_0", "Q4_K_M", "F16", ...)
    context_length: int | None
    embedding_length: int | None
    info: GgufInfo = dataclasses.field(repr=False)

    @property
    def digest(self) -> str:
        """The sha256 hex of the file (a split model's first part): seconds for gigabytes the first time (see
        file_sha256)."""
        return file_sha256(self.path)

    @property
    def parameter_size(self) -> str:
        """The parameter count as Ollama writes it ("135M", "7.6B")."""
        return human_number(self.parameter_count)

    @property
    def chat_template(self) -> str | None:
        return self.info.chat_templates().get("default")

    def capabilities(self, multimodal: bool = False, template: str | None = None) -> list[str]:
        """What the model can do, in Ollama's words and by its rules (server/images.go, Model.Capabilities): a
        model with a pooling type embeds, any other completes; tools, thinking from its chat template (`template`,
        the one it is served with, else the GGUF's); insert from its fill-in-the-middle tokens (a GGUF's, where
        Ollama reads its own template's `.Suffix`); vision with a projector (`multimodal`) or a vision tower in
        the file."""
        keys = self.info.metadata
        template = template if template is not None else self.chat_template or ""
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
        path=p, size=sum(q.stat().st_size for q in parts), modified=p.stat().st_mtime,
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


_sha256s: dict[tuple[str, int, int], str] = {}  # (resolved path, size, mtime_ns) -> sha256 hex
_hashing: dict[tuple[str, int, int], threading.Lock] = {}  # the files being hashed: a second caller waits
_hashing_lock = threading.Lock()
# Files from this size on are hashed in the background when a server starts serving them (~1 s per GB of one
# core): smaller ones are hashed when first listed, which a client does not notice (a 100 MB model: 0.1 s).
BACKGROUND_HASH_BYTES = 512 * 1024 * 1024


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 hex of the file at `path`, read once per path, size and modification time (a caller that
    comes while another hashes the same file waits for that one). A Hub cache snapshot links each file to its
    blob, named by the file's sha256 (LFS files): that name, read for free."""
    real = Path(path).resolve()
    if _SHA256.match(real.name):
        return real.name
    stat = real.stat()
    key = (str(real), stat.st_size, stat.st_mtime_ns)
    with _hashing_lock:
        if key in _sha256s:
            return _sha256s[key]
        lock = _hashing.setdefault(key, threading.Lock())
    with lock:
        if key not in _sha256s:
            h = hashlib.sha256()
            with open(real, "rb") as fh:
                while block := fh.read(1 << 20):
                    h.update(block)
            _sha256s[key] = h.hexdigest()
    with _hashing_lock:
        _hashing.pop(key, None)
    return _sha256s[key]


def hash_in_background(path: str | os.PathLike[str] | None) -> threading.Thread | None:
    """Start hashing the file at `path` (file_sha256) in a daemon thread if it is big (BACKGROUND_HASH_BYTES),
    so that the first model list does not wait for it; None where nothing was started (small, gone, no path)."""
    try:
        if path is None or Path(path).stat().st_size < BACKGROUND_HASH_BYTES:
            return None
    except OSError:
        return None

    def run() -> None:
        try:
            file_sha256(path)
        except OSError:  # gone or unreadable since: the list that asks says so
            pass

    thread = threading.Thread(target=run, name="llamaplug-sha256", daemon=True)
    thread.start()
    return thread


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
