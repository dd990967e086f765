"""A request body as the guard (app.py) hands it on: read whole up to a cap, and JSON that llama-server's parser
refuses refused here too, in the API's error shape, before any route runs.

Python's json module reads `NaN`, `Infinity` and numbers past a double's range (1e400 becomes inf), and
lets `"\\ud800"` through as a lone surrogate; llama-server's parser (nlohmann::json) refuses all of
them with a 400. Taken in, they came out as a 500 wherever a float must be finite or a string UTF-8.
Most bodies contain none of their spellings: only those that do are parsed here (a second time).
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from starlette.types import Message, Receive

from .errors import BadRequestError

OFF_LOOP = 1 << 20  # bytes: a body this big is read in a worker thread, not on the event loop
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
# What a body must contain to hold one of the values refused (the cheap test before a full parse; bytes.find
# and bytes.translate, not a regular expression: 8 MiB took a regex 1.4 s, holding the GIL).
_SPELLINGS = (b"NaN", b"Infinity", b"\\ud", b"\\uD")
_BIG_NUMBERS = (b"e000", b"e+000", b"E000", b"E+000", b"0" * 300)  # in the digits-as-0 copy: a double's range ends
# at 1.8e308, so only a 3-digit exponent or a 300-digit number can pass it


class BodyTooLarge(Exception):
    """A body longer than the cap (the guard answers 413)."""


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body (None: the client went away first); BodyTooLarge once it passes `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` once, whole, then what `receive` gives (the disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def again() -> Message:
        return pending.pop() if pending else await receive()

    return again


async def check_json(body: bytes) -> None:
    """BadRequestError if `body` is JSON holding NaN, an infinity, a number past a double's range or a lone surrogate.
    Any other fault (not JSON at all, say) is left to the route's own parse and its 400."""
    if len(body) > OFF_LOOP:
        await asyncio.to_thread(_check, body)
    else:
        _check(body)


def _suspect(body: bytes) -> bool:
    if any(s in body for s in _SPELLINGS):
        return True
    try:
        body.decode("utf-8")  # strict: an encoded surrogate fails here (Python's json takes it, surrogatepass)
    except UnicodeDecodeError:
        return True
    digits = body.translate(_DIGITS)
    return any(s in digits for s in _BIG_NUMBERS)


def _check(body: bytes) -> None:
    if not _suspect(body):
        return
    try:
        value = json.loads(body, parse_constant=_refuse_constant, parse_float=_finite)
    except _NotFinite as exc:
        raise BadRequestError(f"the body is not valid JSON: {exc} is not a finite number (JSON has no NaN or "
                              "infinity)", param="body") from None
    except (ValueError, RecursionError):
        return
    where = _lone_surrogate(value)
    if where is not None:
        raise BadRequestError(f"{where or 'body'}: a lone surrogate (\\ud800-\\udfff without its pair) is not "
                              "Unicode text", param=where or "body")


class _NotFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotFinite(name)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text if len(text) <= 40 else text[:37] + "...")
    return value


def _lone_surrogate(value: Any) -> str | None:
    """The dotted path of the first string (or key) in `value` that is not valid Unicode ("" for the body itself)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if not _unicode(item):
                return path
        elif isinstance(item, dict):
            for key, sub in item.items():
                where = f"{path}.{key}" if path else str(key)
                if not _unicode(key):
                    return path or ""
                stack.append((sub, where))
        elif isinstance(item, list):
            stack.extend((sub, f"{path}.{i}" if path else str(i)) for i, sub in enumerate(item))
    return None


def _unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
