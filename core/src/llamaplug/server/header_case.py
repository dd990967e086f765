"""Response header names as llama-server writes them: `Content-Type`, `Access-Control-Allow-Origin`.

Header names are case-insensitive in HTTP, but a client that copies a response's headers into a plain dict (the
pin's own server tests do: `dict(response.headers)`, then `headers["Access-Control-Allow-Origin"]`) finds only
the spelling llama-server sends. llama-server (cpp-httplib) writes the names its code sets, each hyphenated word
capitalised. ASGI carries names in lower case (its spec asks for it, and Starlette and our middlewares compare them
so), and uvicorn's httptools protocol lowers any name it is given; so the names are spelled at the last step, the
transport write of each response's head (`title_heads`), and nothing inside the app sees another spelling.
"""

from __future__ import annotations

import functools
from typing import Any

# Names llama-server spells other than word by word.
_SPELLED = {b"etag": b"ETag"}


@functools.lru_cache(maxsize=256)
def spelled(name: bytes) -> bytes:
    """`name` as llama-server writes it: b"access-control-allow-origin" -> b"Access-Control-Allow-Origin"."""
    lower = name.lower()
    return _SPELLED.get(lower) or b"-".join(word[:1].upper() + word[1:] for word in lower.split(b"-"))


def spelled_head(data: bytes) -> bytes:
    """A response head (status line, header lines, blank line: what the protocol writes at once) with each header
    name `spelled`; anything after the head is left as it is."""
    end = data.find(b"\r\n\r\n")
    head, rest = (data, b"") if end < 0 else (data[:end], data[end:])
    lines = head.split(b"\r\n")
    for i in range(1, len(lines)):
        name, colon, value = lines[i].partition(b":")
        if colon:
            lines[i] = spelled(name) + colon + value
    return b"\r\n".join(lines) + rest


class _HeadWriter:
    """One request's transport for uvicorn's request-response cycle: its first write that is no interim answer
    (100 Continue) is the response's head, written `spelled_head`; every other call goes to the transport."""

    def __init__(self, transport: Any):
        self._transport = transport
        self._head_to_come = True

    def write(self, data: bytes) -> None:
        if self._head_to_come:
            self._head_to_come = data.startswith(b"HTTP/1.1 1")
            data = spelled_head(data)
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def title_heads(cycle: Any) -> None:
    """Have uvicorn's request-response `cycle` (either protocol's, just made: it has written nothing yet) write
    its head's names as llama-server does. A cycle already so (a call for a request that made none) is left."""
    if cycle is not None and not isinstance(cycle.transport, _HeadWriter):
        cycle.transport = _HeadWriter(cycle.transport)
