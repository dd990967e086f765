"""Checks of a context state before llama.cpp reads it (it trusts the lengths it finds there)."""

from __future__ import annotations

from pathlib import Path

from ..errors import StateError

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
