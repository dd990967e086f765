"""A GGUF header check, run before llama.cpp sees a file.

llama.cpp's own reader reports most malformed files, but it trusts the
header's counts when it allocates; this refuses files whose header cannot be
right for their size, with a message naming the file and the field.

It then reads the whole header (key/values and tensor infos) with a small
reader of its own and refuses the values that make the pinned llama.cpp
*abort the process* (GGML_ASSERT, an uncaught C++ exception, a segfault)
instead of failing the load. Each check below names the upstream line it
stands in for; every one of them was found by fuzzing (tests/test_fuzz_gguf.py,
bench/fuzz_gguf.py). Where the header is malformed, this reader stops and leaves
the verdict to llama.cpp's reader, whose messages are the ones users see.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import struct
from pathlib import Path
from typing import Any

from ..errors import InvalidModelError, ModelNotFoundError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
HEADER = struct.Struct("<4sIQQ")  # magic, version, n_tensors, n_kv
# The smallest possible tensor-info and key/value entries (an empty name, no dims).
MIN_TENSOR_INFO = 8 + 4 + 4 + 8
MIN_KV = 8 + 4 + 1

# Limits of the pinned llama.cpp / ggml.
GGUF_MAX_STRING_LENGTH = 1 << 30  # gguf.cpp
GGUF_MAX_ARRAY_ELEMENTS = 1 << 30  # gguf.cpp
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64
GGML_TYPE_COUNT = 43
GGML_REMOVED_TYPES = frozenset({4, 5, 31, 32, 33, 36, 37, 38})  # block size 0: gguf.cpp refuses them
TENSOR_ALIGNMENT = 32  # ggml-impl.h: the CPU buffer's alignment, which mmap'd tensor data must keep
LLAMA_MAX_LAYERS = 512  # llama-hparams.h
LLAMA_MAX_EXPERTS = 1024  # llama-hparams.h
ROPE_SCALING_TYPES = frozenset({b"none", b"linear", b"yarn", b"longrope"})  # llama-model.cpp

# GGUF value types.
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
_SCALARS = {T_U8: struct.Struct("<B"), T_I8: struct.Struct("<b"), T_U16: struct.Struct("<H"),
            T_I16: struct.Struct("<h"), T_U32: struct.Struct("<I"), T_I32: struct.Struct("<i"),
            T_F32: struct.Struct("<f"), T_BOOL: struct.Struct("<b"), T_U64: struct.Struct("<Q"),
            T_I64: struct.Struct("<q"), T_F64: struct.Struct("<d")}
_U32, _U64, _I64 = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<q")
_KEEP_ARRAY = 4096  # numeric arrays up to this length are kept (per-layer hyperparameters)
_KEEP_STRINGS = (b"tokenizer.ggml.tokens",)

# ggml types without a CPU dot product: a weight of one of these in a matrix multiplication
# segfaults (I8..F64) or aborts (Q8_K, only ever an activation type) in llama_decode.
_NO_MATMUL_TYPES = {15: "Q8_K", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64"}
# Weights llama.cpp uses as the matrix of a MUL_MAT (llm_tensor_info in llama-arch.cpp), the
# common transformer ones: their type must have a dot product.
_MATMUL_WEIGHTS = frozenset({
    "token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "attn_gate", "attn_q_a",
    "attn_q_b", "attn_kv_a_mqa", "attn_kv_b", "attn_k_b", "attn_v_b", "ffn_gate", "ffn_up", "ffn_down",
    "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps", "ffn_gate_shexp", "ffn_up_shexp",
    "ffn_down_shexp", "ffn_gate_inp",
})
# Every ggml type the pinned ggml knows: name, elements per block, bytes per block (ggml.c type_traits).
# The one table of ggml type sizes in the core; tests/test_inspect.py checks it against gguf's GGML_QUANT_SIZES.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}
_GGML_TYPE_NAMES = {t: name for t, (name, _, _) in GGML_TYPES.items()}


def check_model_path(path: str | os.PathLike[str]) -> Path:
    """Return the path if it looks like a GGUF file; raise ModelNotFoundError / InvalidModelError if not."""
    return inspect_model(path).path


@dataclasses.dataclass(frozen=True)
class GgufHeader:
    """What the pre-check learned; `data_offset` is None where the header could not be read to its end."""

    path: Path
    version: int
    n_tensors: int
    n_kv: int
    data_offset: int | None = None
    byte_gaps: ByteGaps | None = None

    @property
    def mmap_aligned(self) -> bool:
        """Whether llama.cpp can mmap the tensor data (its CPU buffers need TENSOR_ALIGNMENT)."""
        return self.data_offset is None or self.data_offset % TENSOR_ALIGNMENT == 0


def inspect_model(path: str | os.PathLike[str]) -> GgufHeader:
    """Check the file as check_model_path does and return what its header says."""
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
    header = GgufHeader(p, version, n_tensors, n_kv)
    parsed = _read_header(p, size, n_tensors, n_kv)
    if parsed is None:
        return header  # malformed: llama.cpp's reader says how
    kvs, tensors, data_offset = parsed
    byte_gaps = _check_values(p, kvs, tensors)
    return dataclasses.replace(header, data_offset=data_offset, byte_gaps=byte_gaps)


@dataclasses.dataclass(frozen=True)
class ByteGaps:
    """An SPM vocabulary without byte tokens for some bytes.

    llama.cpp's SPM tokenizer spells a character that is not a token with byte tokens
    (byte_to_token: token_to_id.at("<0xXX>")); where one is missing, std::out_of_range goes
    through llama_tokenize, a C function, and std::terminate aborts the process.
    """

    missing: frozenset[int]
    tokens: frozenset[bytes]

    def unencodable(self, text: str) -> str | None:
        """The first character of `text` that llama.cpp would abort on, or None."""
        for ch in text:
            piece = ("\u2581" if ch == " " else ch).encode("utf-8", "surrogatepass")
            if piece not in self.tokens and any(b in self.missing for b in piece):
                return ch
        return None


# -- the reader -----------------------------------------------------------------------------------


class _Malformed(Exception):
    """The header does not parse; llama.cpp will refuse the file with its own message."""


@dataclasses.dataclass
class _Array:
    elem: int
    count: int
    items: Any = None  # a tuple of numbers, a list of bytes, or None where not kept


@dataclasses.dataclass
class _Tensor:
    name: bytes
    dims: tuple[int, ...]
    ggml_type: int
    offset: int = 0  # from the start of the tensor data


def _read_header(p: Path, size: int, n_tensors: int, n_kv: int
                 ) -> tuple[dict[bytes, tuple[int, Any]], list[_Tensor], int] | None:
    try:
        with p.open("rb") as fh:
            try:
                buf: Any = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):  # not mappable (a pipe, a special file system): read it
                buf = fh.read()
    except OSError as exc:
        raise InvalidModelError(f"cannot read model file {p}: {exc.strerror}") from None
    try:
        return _parse(buf, size, n_tensors, n_kv)
    except (_Malformed, struct.error, IndexError, OverflowError, MemoryError):
        return None
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()


def _strings(buf: Any, pos: int, end: int, count: int, keep: bool) -> tuple[list[bytes] | None, int]:
    """A string array's items (None unless `keep`) and the position after it; _Malformed where gguf.cpp would
    refuse it. The loop of every load (a vocabulary: 50k to 250k strings), so it does no more than it must:
    reading past the end is struct.error (malformed too), and a length that runs past the end is seen once,
    after the loop, where the position has passed the end."""
    unpack = _U64.unpack_from
    limit = GGUF_MAX_STRING_LENGTH
    if not keep:
        for _ in range(count):
            n = unpack(buf, pos)[0]
            if n > limit:
                raise _Malformed
            pos += 8 + n
    else:
        items: list[bytes] = []
        append = items.append
        for _ in range(count):
            n = unpack(buf, pos)[0]
            if n > limit:
                raise _Malformed
            at = pos + 8
            pos = at + n
            append(buf[at:pos])
    if pos > end:
        raise _Malformed
    return (items if keep else None), pos


def _parse(buf: Any, size: int, n_tensors: int, n_kv: int, *, keep_array: int = _KEEP_ARRAY,
           keep_strings: bool = False) -> tuple[dict[bytes, tuple[int, Any]], list[_Tensor], int]:
    """The key/values, the tensor infos and the data offset; _Malformed where gguf.cpp would refuse.

    The items of numeric arrays up to `keep_array` long are kept, and with `keep_strings` those of string
    arrays too (`llamaplug inspect`); loading keeps only what the checks read, tokenizer.ggml.tokens.
    """
    end = min(size, len(buf))
    pos = HEADER.size

    def take(n: int) -> int:
        nonlocal pos
        if n < 0 or n > end - pos:
            raise _Malformed
        at = pos
        pos += n
        return at

    def string() -> bytes:
        n = _U64.unpack_from(buf, take(8))[0]
        if n > GGUF_MAX_STRING_LENGTH:
            raise _Malformed
        at = take(n)
        return buf[at:at + n]

    kvs: dict[bytes, tuple[int, Any]] = {}
    for _ in range(n_kv):
        key = string()
        if not key or key in kvs:
            raise _Malformed  # gguf.cpp: empty or duplicate key
        vtype = _U32.unpack_from(buf, take(4))[0]
        if vtype == T_ARR:
            elem = _U32.unpack_from(buf, take(4))[0]
            count = _U64.unpack_from(buf, take(8))[0]
            if count > GGUF_MAX_ARRAY_ELEMENTS:
                raise _Malformed
            if elem == T_STR:
                if count * 8 > end - pos:
                    raise _Malformed
                keep = key in _KEEP_STRINGS or (keep_strings and count <= keep_array)
                items, pos = _strings(buf, pos, end, count, keep)
                kvs[key] = (T_ARR, _Array(elem, count, items))
            elif elem in _SCALARS:
                s = _SCALARS[elem]
                at = take(count * s.size)
                kept = None
                if count <= keep_array:
                    kept = struct.unpack_from(f"<{count}{s.format[-1]}", buf, at)
                kvs[key] = (T_ARR, _Array(elem, count, kept))
            else:
                raise _Malformed  # nested arrays and unknown types
        elif vtype == T_STR:
            kvs[key] = (T_STR, string())
        elif vtype in _SCALARS:
            s = _SCALARS[vtype]
            kvs[key] = (vtype, s.unpack_from(buf, take(s.size))[0])
        else:
            raise _Malformed

    alignment = 32
    if b"general.alignment" in kvs:
        vtype, value = kvs[b"general.alignment"]
        if vtype != T_U32 or value == 0 or value & (value - 1):
            raise _Malformed
        alignment = value

    tensors: list[_Tensor] = []
    names: set[bytes] = set()
    for _ in range(n_tensors):
        name = string()
        if len(name) >= GGML_MAX_NAME or name in names:
            raise _Malformed
        names.add(name)
        n_dims = _U32.unpack_from(buf, take(4))[0]
        if n_dims > GGML_MAX_DIMS:
            raise _Malformed
        dims = tuple(_I64.unpack_from(buf, take(8))[0] for _ in range(n_dims))
        if any(d < 0 for d in dims) or math.prod(dims) > 2**63 - 1:
            raise _Malformed
        ggml_type = struct.unpack_from("<i", buf, take(4))[0]
        if not 0 <= ggml_type < GGML_TYPE_COUNT or ggml_type in GGML_REMOVED_TYPES:
            raise _Malformed
        offset = _U64.unpack_from(buf, take(8))[0]  # gguf.cpp checks that offsets are consecutive
        tensors.append(_Tensor(name, dims, ggml_type, offset))
    data_offset = pos
    if n_tensors:
        data_offset = (pos + alignment - 1) // alignment * alignment
        if data_offset > size:
            raise _Malformed
    return kvs, tensors, data_offset


# -- values that crash llama.cpp --------------------------------------------------------------------


def _u32(kvs: dict[bytes, tuple[int, Any]], key: bytes) -> int | None:
    """The value of a UINT32 key (llama.cpp's get_key accepts exactly that type; others fail the load)."""
    vtype, value = kvs.get(key, (None, None))
    return value if vtype == T_U32 else None


def _u32_or_array(kvs: dict[bytes, tuple[int, Any]], key: bytes, n_layer: int) -> list[int] | None:
    """A per-layer value as llama.cpp's get_key_or_arr reads it (UINT32, or a BOOL/INT32/UINT32 array of n_layer)."""
    vtype, value = kvs.get(key, (None, None))
    if vtype == T_U32:
        return [value]
    if vtype == T_ARR and value.elem in (T_BOOL, T_U32, T_I32) and value.count == n_layer and value.items is not None:
        if value.elem == T_BOOL:
            return [int(v != 0) for v in value.items]
        return [v & 0xFFFFFFFF for v in value.items]
    return None


def _check_values(p: Path, kvs: dict[bytes, tuple[int, Any]], tensors: list[_Tensor]) -> ByteGaps | None:
    def refuse(what: str, upstream: str) -> None:
        raise InvalidModelError(f"invalid GGUF model {p}: {what} (llama.cpp would abort the process: {upstream})")

    vtype, arch_value = kvs.get(b"general.architecture", (None, None))
    arch = arch_value if vtype == T_STR else None
    if arch is not None:
        def key(name: str) -> bytes:
            return arch + b"." + name.encode()

        def shown(name: str) -> str:
            return key(name).decode("utf-8", "replace")

        # llama-model.cpp load_hparams: GGML_ASSERT(n_layer_all > 0 && n_layer_all <= LLAMA_MAX_LAYERS)
        n_layer = _u32(kvs, key("block_count"))
        if n_layer is not None and not 0 < n_layer <= LLAMA_MAX_LAYERS:
            refuse(f"{shown('block_count')} = {n_layer}, must be 1..{LLAMA_MAX_LAYERS}",
                   "GGML_ASSERT(n_layer_all > 0 && n_layer_all <= LLAMA_MAX_LAYERS)")
        if n_layer is not None:
            # GGML_ASSERT(n_layer_nextn <= n_layer_all)
            nextn = _u32(kvs, key("nextn_predict_layers"))
            if nextn is not None and nextn > n_layer:
                refuse(f"{shown('nextn_predict_layers')} = {nextn} exceeds block_count {n_layer}",
                       "GGML_ASSERT(n_layer_nextn <= n_layer_all)")
            _check_experts(kvs, key, shown, n_layer, arch, refuse)
        # GGML_ASSERT(rope_scaling_type_train != LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED)
        vtype, scaling = kvs.get(key("rope.scaling.type"), (None, None))
        if vtype == T_STR and scaling not in ROPE_SCALING_TYPES:
            refuse(f"{shown('rope.scaling.type')} = {scaling[:40]!r} is not one of "
                   f"{sorted(s.decode() for s in ROPE_SCALING_TYPES)}",
                   "GGML_ASSERT(rope_scaling_type_train != LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED)")
    # ggml-cpu ops.cpp norm / rms_norm / group_norm: GGML_ASSERT(eps >= 0.0f), at the first decode
    for k, (vtype, value) in kvs.items():
        if vtype in (T_F32, T_F64) and (k.endswith(b"epsilon") or k.endswith(b"_eps")) and not value >= 0:
            refuse(f"{k.decode('utf-8', 'replace')} = {value}, a norm epsilon must be >= 0",
                   "GGML_ASSERT(eps >= 0.0f) in the first llama_decode")
    byte_gaps = _check_vocabulary(kvs, refuse)
    _check_tensor_types(tensors, refuse)
    return byte_gaps


def _check_experts(kvs: dict[bytes, tuple[int, Any]], key: Any, shown: Any, n_layer: int, arch: bytes,
                   refuse: Any) -> None:
    """llama-model.cpp load_hparams' expert asserts."""
    n_expert = _u32(kvs, key("expert_count")) or 0
    used = _u32_or_array(kvs, key("expert_used_count"), n_layer) or [0]
    groups = _u32(kvs, key("expert_group_count")) or 0
    group_used = _u32(kvs, key("expert_group_used_count")) or 0
    if arch in (b"hunyuan_vl", b"hunyuan-dense") and n_expert <= 1:
        n_expert, used = 0, [0]
    used_max = max(used)
    if n_expert > LLAMA_MAX_EXPERTS:
        refuse(f"{shown('expert_count')} = {n_expert} exceeds {LLAMA_MAX_EXPERTS}",
               "GGML_ASSERT(n_expert <= LLAMA_MAX_EXPERTS)")
    if used_max > n_expert:
        refuse(f"{shown('expert_used_count')} = {used_max} exceeds expert_count {n_expert}",
               "GGML_ASSERT(n_expert_used_max <= n_expert)")
    if n_expert > 0:
        if used_max == 0:
            refuse(f"{shown('expert_count')} = {n_expert} but expert_used_count is 0 or missing",
                   "GGML_ASSERT(n_expert_used_max > 0)")
        if groups >= n_expert:
            refuse(f"{shown('expert_group_count')} = {groups} is not below expert_count {n_expert}",
                   "GGML_ASSERT(n_expert_groups < n_expert)")
        if groups > 1 and (n_expert % groups or not 0 < group_used < groups):
            refuse(f"{shown('expert_group_count')} = {groups} / expert_group_used_count = {group_used} "
                   f"do not divide expert_count {n_expert}", "GGML_ASSERT on the expert groups")
    elif groups:
        refuse(f"{shown('expert_group_count')} = {groups} without experts", "GGML_ASSERT(n_expert_groups == 0)")


def _check_vocabulary(kvs: dict[bytes, tuple[int, Any]], refuse: Any) -> ByteGaps | None:
    # llama-vocab.cpp load: GGML_ASSERT(id_to_token.size() == token_to_id.size()): two tokens with
    # the same text abort the load. The text is what llama.cpp sees: gguf_get_arr_str returns a C
    # string, so it ends at the first NUL, and an empty text becomes "[EMPTY_<id>]".
    vtype, tokens = kvs.get(b"tokenizer.ggml.tokens", (None, None))
    if vtype != T_ARR or tokens.elem != T_STR or tokens.items is None:
        return None  # missing or mistyped: llama.cpp refuses it
    if kvs.get(b"tokenizer.ggml.model") in ((T_STR, b"none"), (T_STR, b"no_vocab")):
        return None  # llama.cpp does not read the tokens then
    texts = tokens.items
    if not all(texts) or b"\0" in b"".join(texts):  # rare: spare every load the per-token rewrite
        texts = [t.split(b"\0", 1)[0] or b"[EMPTY_%d]" % i for i, t in enumerate(texts)]
    if len(set(texts)) != len(texts):
        seen: dict[bytes, int] = {}
        for i, t in enumerate(texts):
            if t in seen:
                refuse(f"tokenizer.ggml.tokens has token {i} with the same text as token {seen[t]} ({t[:40]!r})",
                       "GGML_ASSERT(id_to_token.size() == token_to_id.size())")
            seen[t] = i
    if kvs.get(b"tokenizer.ggml.model") != (T_STR, b"llama"):
        return None
    known = frozenset(texts)
    missing = frozenset(b for b in range(256) if b"<0x%02X>" % b not in known and (not b or bytes([b]) not in known))
    return ByteGaps(missing, known) if missing else None


def _check_tensor_types(tensors: list[_Tensor], refuse: Any) -> None:
    for t in tensors:
        name = t.name.decode("utf-8", "replace")
        base = name.split(".", 2)[2] if name.startswith("blk.") and name.count(".") >= 2 else name
        stem, _, suffix = base.rpartition(".")
        type_name = _GGML_TYPE_NAMES.get(t.ggml_type, str(t.ggml_type))
        # ggml-cpu binary-ops.cpp: "unsupported types" abort: a norm weight multiplies F32 activations,
        # a bias is added to them; only an F32 operand is supported.
        if t.ggml_type != 0 and (base.endswith("norm.weight") or (suffix == "bias" and len(t.dims) <= 1)):
            refuse(f"tensor {name} is {type_name}; norm weights and biases must be F32",
                   "binary_op: unsupported types, in the first llama_decode")
        # ggml-cpu mul_mat: no dot product for these types (segfault / abort)
        if suffix == "weight" and stem in _MATMUL_WEIGHTS and t.ggml_type in _NO_MATMUL_TYPES:
            refuse(f"tensor {name} is {type_name}, a type llama.cpp cannot multiply matrices with",
                   "mul_mat has no dot product for it, in the first llama_decode")
