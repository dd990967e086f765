"""Text across the C boundary: user strings into UTF-8, llama.cpp's snprintf-style getters into str."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidParameterError
from ..raw import ffi


def encode_text(text: str, what: str = "text") -> bytes:
    """UTF-8 of user text; unencodable input (lone surrogates) is an error, never silently replaced."""
    if not isinstance(text, str):
        raise InvalidParameterError(f"{what} must be str, got {type(text).__name__}", field=what)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidParameterError(
            f"{what} is not valid Unicode at character {exc.start} ({text[exc.start:exc.end]!r}): {exc.reason}",
            field=what,
        ) from None


def read_string(fill: Any, size: int = 256) -> str:
    """Call a llama.cpp snprintf-style getter, growing the buffer once if needed."""
    buf = ffi.new("char[]", size)
    n = fill(buf, size)
    if n >= size:
        buf = ffi.new("char[]", n + 1)
        n = fill(buf, n + 1)
    return "" if n < 0 else ffi.string(buf).decode("utf-8", "replace")
