"""The KV cache of a context: its sequences' cells, edited between decodes (llama_memory_*).

Mixed into LlamaContext (not a separate object: `ctx.kv_cache_seq_rm(...)` is seed 004's
spelling, and the edits move the context's own `n_past` and `epoch`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidParameterError
from ..raw import lib
from ._handle import NativeHandle


class KvCache(NativeHandle):
    """LlamaContext's KV-cache methods; the context sets `_mem`, `n_past`, `epoch` and `_outputs`."""

    _mem: Any  # llama_memory_t of the context
    n_past: int  # where sequence 0 ends: the next position eval/decode_single writes
    # Bumped by everything that changes the KV cache or how it is computed (decodes, cache
    # edits, adapters, states): the engine's prefix cache trusts its slots only while it has not moved.
    epoch: int
    _outputs: np.ndarray  # which tokens of the last batch produced outputs

    @property
    def n_seq_max(self) -> int:
        return int(lib.llama_n_seq_max(self._ptr))

    def _check_seq(self, seq_id: int, allow_all: bool = False) -> None:
        if allow_all and seq_id == -1:
            return
        if not 0 <= seq_id < self.n_seq_max:
            raise InvalidParameterError(
                f"seq_id {seq_id} is outside 0..{self.n_seq_max - 1} (n_seq_max={self.n_seq_max})"
                + (" or -1 for all" if allow_all else ""), field="seq_id")

    @property
    def _memory(self) -> Any:
        self._ptr  # noqa: B018 - raises ClosedError once closed
        return self._mem

    def _resync(self) -> None:
        """n_past from what the cache holds now; no logits until the next decode."""
        self.n_past = self.kv_cache_seq_pos_max(0) + 1
        self._outputs = np.zeros(0, dtype=np.int8)
        self.epoch += 1

    def clear_cache(self) -> None:
        """Empty the KV cache of every sequence."""
        lib.llama_memory_clear(self._memory, True)
        self.epoch += 1
        self.n_past = 0
        self._outputs = np.zeros(0, dtype=np.int8)

    kv_cache_clear = clear_cache

    def kv_cache_seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        self.epoch += 1
        self._check_seq(seq_id, allow_all=True)
        ok = bool(lib.llama_memory_seq_rm(self._memory, seq_id, p0, p1))
        if ok and seq_id in (0, -1):  # sequence 0 is the one n_past tracks
            self.n_past = int(lib.llama_memory_seq_pos_max(self._memory, 0)) + 1
        return ok

    def kv_cache_seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        self.epoch += 1
        self._check_seq(seq_id_src)
        self._check_seq(seq_id_dst)
        lib.llama_memory_seq_cp(self._memory, seq_id_src, seq_id_dst, p0, p1)

    def kv_cache_seq_keep(self, seq_id: int) -> None:
        self.epoch += 1
        self._check_seq(seq_id)
        lib.llama_memory_seq_keep(self._memory, seq_id)

    def kv_cache_seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Add `delta` to the positions in [p0, p1) of `seq_id` (seed 004's kv_cache_seq_shift).

        The sliding window: drop [keep, keep + n) with kv_cache_seq_rm, shift what follows
        by -n; n_past then follows sequence 0's new end, so decoding goes on after it.
        """
        self._check_seq(seq_id)
        if not self.kv_cache_can_shift:
            raise InvalidParameterError("this model's memory cannot shift positions", field="delta")
        lib.llama_memory_seq_add(self._memory, seq_id, p0, p1, delta)
        self.epoch += 1
        if seq_id == 0:
            self.n_past = int(lib.llama_memory_seq_pos_max(self._memory, 0)) + 1

    kv_cache_seq_shift = kv_cache_seq_add

    def kv_cache_seq_discard(self, seq_id: int, keep: int, n: int, end: int) -> None:
        """The sliding window in one step (a context shift): drop [keep, keep + n) of `seq_id` and move
        [keep + n, end) down by n."""
        self.kv_cache_seq_rm(seq_id, keep, keep + n)
        self.kv_cache_seq_add(seq_id, keep + n, end, -n)

    @property
    def kv_cache_can_shift(self) -> bool:
        """Whether kv_cache_seq_add can move positions here (llama_memory_can_shift: not a recurrent model's
        state, nor a cache whose positions cannot be rotated)."""
        return bool(lib.llama_memory_can_shift(self._memory))

    def kv_cache_seq_pos_min(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        return int(lib.llama_memory_seq_pos_min(self._memory, seq_id))

    def kv_cache_seq_pos_max(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        return int(lib.llama_memory_seq_pos_max(self._memory, seq_id))
