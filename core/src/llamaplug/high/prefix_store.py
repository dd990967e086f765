"""KV of sequences that left their slot, kept in host memory for later prompts with the same prefix.

The engine saves a slot's sequence before a new request cuts most of it away, and gives a
new prompt the stored sequence sharing the longest prefix with it when no free slot shares
more (llama-server's --cache-ram). Past the byte limit, the least recently used entry goes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixStore:
    """Token sequences and their KV bytes (LlamaContext.state_seq_get), at most `limit` bytes in all."""

    def __init__(self, limit: int):
        self.limit = limit
        self.size = 0
        self._entries: OrderedDict[tuple[int, ...], bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.size = 0

    def covers(self, tokens: Sequence[int]) -> bool:
        """Whether an entry holds `tokens` already (itself or a longer sequence starting with them)."""
        n = len(tokens)
        return any(len(key) >= n and common_prefix(key, tokens) == n for key in self._entries)

    def put(self, tokens: Sequence[int], data: bytes) -> None:
        if len(data) > self.limit:
            return
        key = tuple(tokens)
        for old in [k for k in self._entries if len(k) <= len(key) and key[:len(k)] == k]:
            self.size -= len(self._entries.pop(old))  # a prefix of the new entry says nothing more
        self._entries[key] = data
        self.size += len(data)
        while self.size > self.limit:
            self.size -= len(self._entries.popitem(last=False)[1])

    def best(self, prompt: Sequence[int]) -> tuple[tuple[int, ...], int]:
        """The entry sharing the longest prefix with `prompt`, and that length (0: none)."""
        found: tuple[int, ...] = ()
        n = 0
        if not prompt:
            return found, n
        for key in self._entries:
            if key[0] == prompt[0]:
                m = common_prefix(key, prompt)
                if m > n:
                    found, n = key, m
        return found, n

    def get(self, key: tuple[int, ...]) -> bytes | None:
        """The bytes stored for `key` (now the most recently used); None once it is gone (a `put` since `best`
        may have dropped it)."""
        data = self._entries.get(key)
        if data is not None:
            self._entries.move_to_end(key)
        return data
