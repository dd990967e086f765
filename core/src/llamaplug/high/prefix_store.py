"""KV of sequences that left their slot, kept in host memory for later prompts with the same prefix.

The engine saves a slot's sequence before a new request cuts most of it away, and gives a
new prompt the stored sequence sharing the longest prefix with it when no free slot shares
more (llama-server's --cache-ram). Past the byte limit, the least recently used entry goes
(`evicted`: to the disk tier below it, when there is one: disk_store.py's TieredStore).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..blocks.context import LlamaContext


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
            self.evicted(tuple(tokens), data)
            return
        key = tuple(tokens)
        for old in [k for k in self._entries if len(k) <= len(key) and key[:len(k)] == k]:
            self.size -= len(self._entries.pop(old))  # a prefix of the new entry says nothing more
        self._entries[key] = data
        self.size += len(data)
        while self.size > self.limit:
            old, old_data = self._entries.popitem(last=False)
            self.size -= len(old_data)
            self.evicted(old, old_data)

    def evicted(self, key: tuple[int, ...], data: bytes) -> None:
        """An entry the byte limit pushed out (or one too large to keep): gone here."""

    def prefilled(self, tokens: Sequence[int], read: int, seq_bytes: Callable[[], bytes]) -> None:
        """A slot just read a prompt (`tokens`, `read` of them decoded now; `seq_bytes()` gives its KV)."""

    def refused(self, key: tuple[int, ...]) -> None:
        """The context refused the bytes `get(key)` gave: they are not kept."""
        data = self._entries.pop(key, None)
        if data is not None:
            self.size -= len(data)

    def close(self, context: LlamaContext, slots: Sequence[tuple[int, Sequence[int]]]) -> None:
        """The engine closes cleanly; `slots`: each idle slot's (sequence id, tokens) still in `context`."""

    def entries(self) -> list[tuple[tuple[int, ...], bytes]]:
        return list(self._entries.items())

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

    def origin(self, key: tuple[int, ...]) -> str:
        """The tier the last `get` of `key` read from ("ram": this store has one)."""
        return "ram"

    def get(self, key: tuple[int, ...]) -> bytes | None:
        """The bytes stored for `key` (now the most recently used); None once it is gone (a `put` since `best`
        may have dropped it)."""
        data = self._entries.get(key)
        if data is not None:
            self._entries.move_to_end(key)
        return data
