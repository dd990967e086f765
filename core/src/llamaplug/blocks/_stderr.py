"""What native code writes to file descriptor 2, captured: llama.cpp's grammar parser and JSON-schema converter
print their reasons there (fprintf), not through its log callback."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator

_stderr_lock = threading.Lock()


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """What native code writes to file descriptor 2 inside the block (the grammar parser's fprintf)."""
    out: list[str] = []
    with _stderr_lock, tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode("utf-8", "replace"))
