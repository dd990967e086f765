"""A context's state: saved to and restored from bytes or files, checked before llama.cpp reads it.

`ContextState` is mixed into LlamaContext (seed 004 spells these `ctx.state_get()` and so on);
a restore moves the context's `n_past` and `epoch` as a KV-cache edit does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import StateError, native_error
from ..raw import ffi, lib
from . import _native_log
from .kv_cache import KvCache

if TYPE_CHECKING:
    from .model import LlamaModel

_MAX_ARCH_NAME = 256  # llama.cpp's architecture names are short
_SESSION_MAGIC, _SESSION_VERSION = 0x6767736E, 10  # LLAMA_SESSION_MAGIC ("ggsn"), LLAMA_SESSION_VERSION


def check_state_head(head: bytes, size: int, what: str) -> None:
    """A state starts with the architecture name, a uint32 length first.

    llama_io_read_i::read_string allocates (and zero-fills) that length before it reads: junk
    there makes llama_state_set_data / llama_state_load_file touch up to 4 GiB and take minutes.
    """
    if len(head) < 4:
        raise StateError(f"{what} is too short to be a llama.cpp state ({size} bytes)")
    n = int.from_bytes(head[:4], "little")
    if n > min(size - 4, _MAX_ARCH_NAME):
        raise StateError(f"{what} is not a llama.cpp state (it starts with an architecture name of {n} bytes)")


def check_state_file(path: Path) -> None:
    """The same check for a session file (magic, version, token count, tokens, then the state)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(12)
        if len(head) < 12:
            return  # llama.cpp reports the short file
        magic, version, n_tokens = int.from_bytes(head[:4], "little"), int.from_bytes(head[4:8], "little"), \
            int.from_bytes(head[8:12], "little")
        if magic != _SESSION_MAGIC or version != _SESSION_VERSION or 12 + 4 * n_tokens > size:
            return  # refused by llama.cpp with its own message
        fh.seek(12 + 4 * n_tokens)
        check_state_head(fh.read(4), size - 12 - 4 * n_tokens, f"state file {path}")


class ContextState(KvCache):
    """LlamaContext's state methods: the whole KV cache, one sequence, or a session file."""

    model: LlamaModel

    def state_size(self) -> int:
        return int(lib.llama_state_get_size(self._ptr))

    def state_get(self) -> bytes:
        """The context state (the KV cache) as bytes."""
        size = self.state_size()
        buf = ffi.new("uint8_t[]", size)
        with _native_log.capture_errors() as errors:
            written = lib.llama_state_get_data(self._ptr, buf, size)
        if written == 0:
            raise native_error(StateError, "llama.cpp could not serialise the context state", errors)
        return ffi.unpack(ffi.cast("char *", buf), written)

    def state_set(self, data: bytes, n_past: int | None = None) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)) or not len(data):
            raise StateError("state must be non-empty bytes from state_get()")
        check_state_head(bytes(memoryview(data)[:4]), len(data), "the state data")
        with _native_log.capture_errors() as errors:
            read = lib.llama_state_set_data(self._ptr, ffi.from_buffer("uint8_t[]", data), len(data))
        if read == 0:
            self._resync()  # llama.cpp may have cleared or half-written the cache before it gave up
            raise native_error(StateError, f"llama.cpp rejected the state ({len(data)} bytes)", errors)
        self.n_past = self.kv_cache_seq_pos_max(0) + 1 if n_past is None else n_past
        self._outputs = np.zeros(0, dtype=np.int8)  # llama.cpp does not restore logits: decode first
        self.epoch += 1

    def state_seq_get(self, seq_id: int) -> bytes:
        """One sequence's KV cells as bytes (for state_seq_set on a context of the same model and shape)."""
        self._check_seq(seq_id)
        size = int(lib.llama_state_seq_get_size(self._ptr, seq_id))
        buf = ffi.new("uint8_t[]", size)
        with _native_log.capture_errors() as errors:
            written = lib.llama_state_seq_get_data(self._ptr, buf, size, seq_id)
        if written == 0:
            raise native_error(StateError, f"llama.cpp could not serialise sequence {seq_id}", errors)
        return ffi.unpack(ffi.cast("char *", buf), written)

    def state_seq_set(self, data: bytes, seq_id: int) -> None:
        """Replace sequence `seq_id`'s cells by those of state_seq_get's bytes (logits: decode first)."""
        self._check_seq(seq_id)
        if not isinstance(data, (bytes, bytearray, memoryview)) or not len(data):
            raise StateError("sequence state must be non-empty bytes from state_seq_get()")
        self.epoch += 1
        with _native_log.capture_errors() as errors:
            read = lib.llama_state_seq_set_data(self._ptr, ffi.from_buffer("uint8_t[]", data), len(data), seq_id)
        if seq_id == 0:
            self.n_past = self.kv_cache_seq_pos_max(0) + 1
        if read == 0:
            raise native_error(StateError, f"llama.cpp rejected the state of sequence {seq_id} ({len(data)} bytes)",
                               errors)

    def state_save_file(self, path: str | os.PathLike[str], tokens: Any = ()) -> Path:
        target = Path(path)
        arr = self.model.check_tokens(tokens)
        c_tokens = ffi.from_buffer("llama_token[]", arr) if arr.size else ffi.NULL
        with _native_log.capture_errors() as errors:
            ok = lib.llama_state_save_file(self._ptr, str(target).encode(), c_tokens, arr.size)
        if not ok:
            raise native_error(StateError, f"could not save the context state to {target}", errors)
        return target

    def state_load_file(self, path: str | os.PathLike[str]) -> list[int]:
        """Restore a state saved by state_save_file; returns the tokens saved with it."""
        source = Path(path)
        if not source.is_file():
            raise StateError(f"state file not found: {source}")
        check_state_file(source)
        capacity = int(lib.llama_n_ctx(self._ptr))  # a session holds at most n_ctx tokens
        tokens = ffi.new("llama_token[]", capacity)
        n = ffi.new("size_t *")
        with _native_log.capture_errors() as errors:
            ok = lib.llama_state_load_file(self._ptr, str(source).encode(), tokens, capacity, n)
        if not ok:
            self._resync()
            raise native_error(StateError, f"could not load state from {source}", errors)
        self.n_past = int(n[0])
        self.epoch += 1
        return ffi.unpack(tokens, int(n[0]))
