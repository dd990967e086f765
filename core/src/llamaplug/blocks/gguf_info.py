"""What a GGUF file holds, for `llamaplug inspect`: every key/value, every tensor, the vocabulary, the chat templates.

It reads the file with the header check's own reader (gguf_header._parse, keeping every array this time),
so a file `inspect` shows is a file loading reads the same way, and a file it refuses is refused with
the message loading gives.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import struct
from pathlib import Path
from typing import Any

from ..errors import InvalidModelError
from .gguf_header import (
    GGML_TYPES,
    T_ARR,
    T_BOOL,
    T_F32,
    T_F64,
    T_I8,
    T_I16,
    T_I32,
    T_I64,
    T_STR,
    T_U8,
    T_U16,
    T_U32,
    T_U64,
    _Array,
    _Malformed,
    _parse,
    inspect_model,
)

# GGUF value type names (gguf's GGUFValueType, lower case).
VALUE_TYPES = {T_U8: "uint8", T_I8: "int8", T_U16: "uint16", T_I16: "int16", T_U32: "uint32", T_I32: "int32",
               T_F32: "float32", T_BOOL: "bool", T_STR: "string", T_ARR: "array", T_U64: "uint64", T_I64: "int64",
               T_F64: "float64"}
# llama.h's llama_token_type, the values of tokenizer.ggml.token_type.
TOKEN_TYPES = {0: "undefined", 1: "normal", 2: "unknown", 3: "control", 4: "user_defined", 5: "unused", 6: "byte"}
ARRAY_HEAD = 16  # array items a summary shows
# Arrays longer than this are counted, not read: a few million items hold any vocabulary, and a
# (sparse) file cannot make inspect build a list of a billion values.
KEEP_ITEMS = 1 << 22
_PARSE_ERRORS = (_Malformed, struct.error, IndexError, OverflowError, MemoryError)


@dataclasses.dataclass(frozen=True)
class GgufValue:
    """One metadata value: `type` is a GGUF type name ("uint32", "string", "array", ...).

    `value` is a number, a bool or a str; for an array of `count` items of `element_type`, a tuple of
    every item, or None for an array longer than KEEP_ITEMS.
    """

    type: str
    value: Any
    element_type: str | None = None
    count: int | None = None

    def summary(self, items: int | None = ARRAY_HEAD) -> dict[str, Any]:
        """The JSON form: {"type", "value"}, or for an array {"type", "element_type", "count", "values"}
        with the first `items` values (all with None; null for an array longer than KEEP_ITEMS)."""
        if self.type != "array":
            return {"type": self.type, "value": self.value}
        shown = None if self.value is None else list(self.value if items is None else self.value[:items])
        return {"type": "array", "element_type": self.element_type, "count": self.count, "values": shown}


@dataclasses.dataclass(frozen=True)
class GgufTensor:
    """One tensor info. `shape` is in ggml's order (ne[0], the row length, first); `offset` is from the file's start."""

    name: str
    type: str
    shape: tuple[int, ...]
    offset: int
    n_elements: int
    n_bytes: int


@dataclasses.dataclass(frozen=True)
class SpecialToken:
    id: int
    text: str | None  # None where the id is not in the vocabulary


@dataclasses.dataclass(frozen=True)
class VocabularySummary:
    """tokenizer.ggml.*: the tokenizer model and pre-tokenizer, the sizes, the special ids and flags."""

    model: str | None
    pre: str | None
    n_tokens: int
    n_merges: int | None
    special: dict[str, SpecialToken]  # "bos", "eos", "eot", ... (tokenizer.ggml.<name>_token_id)
    flags: dict[str, bool]  # "add_bos_token", ... (the tokenizer.ggml.* bools)
    token_types: dict[str, int]  # tokens per token type ("normal", "control", ...)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TypeTotal:
    tensors: int
    parameters: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class GgufInfo:
    """A GGUF file's header, read in full. `read_gguf_info(path)` makes one."""

    path: Path
    size: int
    version: int
    alignment: int
    data_offset: int
    metadata: dict[str, GgufValue]
    tensors: tuple[GgufTensor, ...]

    @property
    def n_parameters(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def n_bytes(self) -> int:
        """The tensors' bytes (without the alignment padding between them)."""
        return sum(t.n_bytes for t in self.tensors)

    def by_type(self) -> dict[str, TypeTotal]:
        """Tensors, parameters and bytes per ggml type, the largest first."""
        totals: dict[str, list[int]] = {}
        for t in self.tensors:
            row = totals.setdefault(t.type, [0, 0, 0])
            row[0] += 1
            row[1] += t.n_elements
            row[2] += t.n_bytes
        ordered = sorted(totals.items(), key=lambda kv: (-kv[1][2], kv[0]))
        return {name: TypeTotal(*row) for name, row in ordered}

    def chat_templates(self) -> dict[str, str]:
        """tokenizer.chat_template as "default", tokenizer.chat_template.NAME as NAME."""
        found = {}
        for key, value in self.metadata.items():
            if value.type != "string":
                continue
            if key == "tokenizer.chat_template":
                found["default"] = value.value
            elif key.startswith("tokenizer.chat_template."):
                found[key[len("tokenizer.chat_template."):]] = value.value
        return found

    def vocabulary(self) -> VocabularySummary | None:
        """None where the file has no tokenizer.ggml.tokens (an mmproj, a LoRA adapter)."""
        md = self.metadata
        tokens = md.get("tokenizer.ggml.tokens")
        if tokens is None or tokens.type != "array":
            return None

        def string(key: str) -> str | None:
            value = md.get(key)
            return value.value if value is not None and value.type == "string" else None

        special: dict[str, SpecialToken] = {}
        flags: dict[str, bool] = {}
        for key, value in md.items():
            if not key.startswith("tokenizer.ggml."):
                continue
            name = key[len("tokenizer.ggml."):]
            if name.endswith("_token_id") and value.type != "array" and isinstance(value.value, int):
                tid = value.value
                text = tokens.value[tid] if tokens.value is not None and 0 <= tid < len(tokens.value) else None
                special[name[:-len("_token_id")]] = SpecialToken(tid, text)
            elif value.type == "bool":
                flags[name] = value.value
        token_types: dict[str, int] = {}
        types = md.get("tokenizer.ggml.token_type")
        if types is not None and types.type == "array" and types.value is not None:
            for t in types.value:
                name = TOKEN_TYPES.get(t, str(t))
                token_types[name] = token_types.get(name, 0) + 1
        merges = md.get("tokenizer.ggml.merges")
        return VocabularySummary(
            model=string("tokenizer.ggml.model"), pre=string("tokenizer.ggml.pre"), n_tokens=tokens.count or 0,
            n_merges=merges.count if merges is not None and merges.type == "array" else None,
            special=special, flags=flags, token_types=dict(sorted(token_types.items(), key=lambda kv: -kv[1])))

    def to_json(self, array_items: int | None = ARRAY_HEAD) -> dict[str, Any]:
        """The document `llamaplug inspect --json` prints (its help gives the schema)."""
        vocabulary = self.vocabulary()
        return {
            "file": {"path": str(self.path), "size": self.size, "version": self.version, "alignment": self.alignment,
                     "data_offset": self.data_offset, "n_kv": len(self.metadata), "n_tensors": len(self.tensors)},
            "metadata": {key: value.summary(array_items) for key, value in self.metadata.items()},
            "tensors": [dataclasses.asdict(t) | {"shape": list(t.shape)} for t in self.tensors],
            "totals": {"n_tensors": len(self.tensors), "n_parameters": self.n_parameters, "n_bytes": self.n_bytes,
                       "by_type": {name: dataclasses.asdict(total) for name, total in self.by_type().items()}},
            "vocabulary": vocabulary.to_json() if vocabulary is not None else None,
            "chat_templates": self.chat_templates(),
        }


def read_gguf_info(path: str | os.PathLike[str]) -> GgufInfo:
    """Read every key/value and tensor info of a GGUF file.

    Raises ModelNotFoundError / InvalidModelError as loading the file would (the same header check
    runs first); a header that does not parse, or tensor infos gguf.cpp would refuse, are an
    InvalidModelError naming the section.
    """
    header = inspect_model(path)
    p = header.path
    try:
        size = p.stat().st_size
        with p.open("rb") as fh:
            try:
                buf: Any = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):  # not mappable: read it
                buf = fh.read()
    except OSError as exc:
        raise InvalidModelError(f"cannot read model file {p}: {exc.strerror}") from None
    try:
        try:
            kvs, raw_tensors, data_offset = _parse(buf, size, header.n_tensors, header.n_kv,
                                                     keep_array=KEEP_ITEMS, keep_strings=True)
        except _PARSE_ERRORS:
            # Which section: the key/values alone parse, or not (the words are gguf.cpp's).
            try:
                _parse(buf, size, 0, header.n_kv)
            except _PARSE_ERRORS:
                raise InvalidModelError(f"invalid GGUF file {p}: failed to read key-value pairs "
                                        f"({header.n_kv} entries): truncated or corrupted") from None
            raise InvalidModelError(f"invalid GGUF file {p}: failed to read tensor info "
                                    f"({header.n_tensors} tensors): truncated or corrupted") from None
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()
    metadata = {key.decode("utf-8", "replace"): _value(vtype, value) for key, (vtype, value) in kvs.items()}
    alignment = metadata["general.alignment"].value if "general.alignment" in metadata else 32
    tensors = []
    expected = 0
    for t in raw_tensors:
        name = t.name.decode("utf-8", "replace")
        type_name, block, type_size = GGML_TYPES[t.ggml_type]
        dims = t.dims or (1,)
        # gguf.cpp's checks of the tensor infos, with its words.
        if dims[0] % block:
            raise InvalidModelError(f"invalid GGUF file {p}: tensor '{name}' of type {type_name}: row size {dims[0]} "
                                    f"is not a multiple of block size ({block})")
        n_bytes = dims[0] // block * type_size * math.prod(dims[1:])
        if t.offset != expected:
            raise InvalidModelError(f"invalid GGUF file {p}: tensor '{name}' has offset {t.offset}, "
                                    f"expected {expected}")
        if data_offset + t.offset + n_bytes > size:
            raise InvalidModelError(f"invalid GGUF file {p}: tensor '{name}' data is not within the file bounds "
                                    f"(bytes {data_offset + t.offset}..{data_offset + t.offset + n_bytes} "
                                    f"of {size})")
        expected += (n_bytes + alignment - 1) // alignment * alignment
        tensors.append(GgufTensor(name, type_name, t.dims, data_offset + t.offset, math.prod(t.dims), n_bytes))
    return GgufInfo(p, size, header.version, alignment, data_offset, metadata, tuple(tensors))


def _value(vtype: int, value: Any) -> GgufValue:
    if vtype == T_ARR:
        assert isinstance(value, _Array)
        items = value.items
        if items is not None and value.elem == T_STR:
            items = tuple(s.decode("utf-8", "replace") for s in items)
        elif items is not None:
            items = tuple(v != 0 for v in items) if value.elem == T_BOOL else tuple(items)
        return GgufValue("array", items, VALUE_TYPES[value.elem], value.count)
    if vtype == T_STR:
        return GgufValue("string", value.decode("utf-8", "replace"))
    if vtype == T_BOOL:
        return GgufValue("bool", value != 0)
    return GgufValue(VALUE_TYPES[vtype], value)
