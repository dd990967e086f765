"""LlamaBatch: tokens, positions and sequence ids for one llama_decode call.

The arrays are numpy arrays owned by the batch; the C `llama_batch` points
into them, so filling the batch is a numpy slice assignment, not a loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidParameterError
from ..params import LLAMA_MAX_SEQ
from ..raw import ffi

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _check_int32(field: str, *values: int) -> None:
    """The arrays are int32: a value outside would raise OverflowError, or wrap silently from numpy."""
    for v in values:
        if not INT32_MIN <= v <= INT32_MAX:
            raise InvalidParameterError(f"{field}={v} does not fit in int32", field=field)


def _int32_array(field: str, values: Any) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.int64).reshape(-1)
    except (OverflowError, TypeError, ValueError) as exc:
        raise InvalidParameterError(f"{field} must be int32 integers: {exc}", field=field) from None
    if arr.size and (arr.min() < INT32_MIN or arr.max() > INT32_MAX):
        _check_int32(field, int(arr.min()), int(arr.max()))
    return arr.astype(np.int32)


class LlamaBatch:
    """Room for `n_tokens` tokens, each in up to `n_seq_max` sequences."""

    def __init__(self, n_tokens: int, n_seq_max: int = 1):
        if not 1 <= n_tokens <= INT32_MAX:
            raise InvalidParameterError(f"LlamaBatch n_tokens must be in 1..{INT32_MAX}, got {n_tokens}",
                                        field="n_tokens")
        if not 1 <= n_seq_max <= LLAMA_MAX_SEQ:
            raise InvalidParameterError(f"LlamaBatch n_seq_max must be in 1..{LLAMA_MAX_SEQ}, got {n_seq_max}",
                                        field="n_seq_max")
        self.capacity = n_tokens
        self.n_seq_max = n_seq_max
        self.token = np.zeros(n_tokens, dtype=np.int32)
        self.pos = np.zeros(n_tokens, dtype=np.int32)
        self.n_seq_id = np.zeros(n_tokens, dtype=np.int32)
        self.seq_ids = np.zeros((n_tokens, n_seq_max), dtype=np.int32)
        self.logits = np.zeros(n_tokens, dtype=np.int8)
        self.n_tokens = 0
        row_ptrs = ffi.new("llama_seq_id *[]", n_tokens)
        base = ffi.cast("llama_seq_id *", ffi.from_buffer(self.seq_ids))
        for i in range(n_tokens):  # once per batch, not per decode
            row_ptrs[i] = base + i * n_seq_max
        self._row_ptrs = row_ptrs
        self._c = ffi.new("struct llama_batch *")
        self._c.token = ffi.cast("llama_token *", ffi.from_buffer(self.token))
        self._c.pos = ffi.cast("llama_pos *", ffi.from_buffer(self.pos))
        self._c.n_seq_id = ffi.cast("int32_t *", ffi.from_buffer(self.n_seq_id))
        self._c.seq_id = row_ptrs
        self._c.logits = ffi.cast("int8_t *", ffi.from_buffer(self.logits))
        self._c.embd = ffi.NULL

    @classmethod
    def one(cls, token: int, pos: int, seq_id: int = 0, logits: bool = True) -> LlamaBatch:
        batch = cls(1, 1)
        batch.add(token, pos, (seq_id,), logits)
        return batch

    def clear(self) -> None:
        self.n_tokens = 0

    def _room(self, k: int) -> int:
        start = self.n_tokens
        if start + k > self.capacity:
            raise InvalidParameterError(
                f"batch overflow: {start} + {k} tokens exceed its capacity of {self.capacity}", field="n_tokens"
            )
        return start

    def add(self, token: int, pos: int, seq_ids: Any = (0,), logits: bool = False) -> None:
        """Append one token at position `pos` belonging to `seq_ids`."""
        seqs = (seq_ids,) if isinstance(seq_ids, int) else tuple(seq_ids)
        if not 1 <= len(seqs) <= self.n_seq_max:
            raise InvalidParameterError(
                f"a token belongs to 1..{self.n_seq_max} sequences in this batch, got {len(seqs)}", field="seq_ids"
            )
        _check_int32("token", token)
        _check_int32("pos", pos)
        _check_int32("seq_id", *seqs)
        i = self._room(1)
        self.token[i] = token
        self.pos[i] = pos
        self.n_seq_id[i] = len(seqs)
        self.seq_ids[i, : len(seqs)] = seqs
        self.logits[i] = logits
        self.n_tokens = i + 1

    def add_sequence(self, tokens: Any, seq_id: int = 0, logits_all: bool = False, pos0: int = 0) -> None:
        """Append `tokens` as sequence `seq_id` at positions pos0, pos0+1, ...; the last one gets logits."""
        arr = _int32_array("tokens", tokens)
        k = arr.size
        if k == 0:
            return
        _check_int32("seq_id", seq_id)
        _check_int32("pos", pos0, pos0 + k - 1)
        i = self._room(k)
        end = i + k
        self.token[i:end] = arr
        self.pos[i:end] = np.arange(pos0, pos0 + k, dtype=np.int32)
        self.n_seq_id[i:end] = 1
        self.seq_ids[i:end, 0] = seq_id
        self.logits[i:end] = 1 if logits_all else 0
        self.logits[end - 1] = 1
        self.n_tokens = end

    def prepare(self) -> LlamaBatch:
        """Seed 001's step before decode: the last token produces logits (the one sampling reads)."""
        if self.n_tokens == 0:
            raise InvalidParameterError("the batch is empty: add tokens before prepare()", field="n_tokens")
        self.logits[self.n_tokens - 1] = 1
        return self

    def c_batch(self) -> Any:
        """The C struct (by value) covering the filled part."""
        self._c.n_tokens = self.n_tokens
        return self._c[0]

    def __len__(self) -> int:
        return self.n_tokens

    def __repr__(self) -> str:
        return f"<LlamaBatch {self.n_tokens}/{self.capacity} tokens>"
