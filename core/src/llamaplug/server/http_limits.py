"""What one HTTP request may cost before any route sees it: the size of its header section and of its body.

A request's headers are read (and held) by the HTTP protocol before the API key is checked,
so their cap lives in the protocol: `protocol(max_header)` is uvicorn's httptools protocol
that answers 431 and closes the connection once a request's header section passes the cap
(llama-server answers 400 at about 1 MiB and closes). Without httptools, uvicorn's h11
protocol has the same cap as its h11_max_incomplete_event_size (`uvicorn_options`). The
body's cap is the guard's (app.py), in the API's error shape. Either protocol writes the response's header names
as llama-server does (header_case.py).
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

from . import header_case


def uvicorn_options(max_header: int) -> dict[str, Any]:
    """uvicorn.run's keyword arguments that cap a request's header section at `max_header` bytes.

    Also ws="none": no route takes a WebSocket, and uvicorn's default would import a WebSocket library
    (20 ms of every start) to answer upgrades with a refusal that plain HTTP gives as well.
    """
    if importlib.util.find_spec("httptools") is None:
        return {"http": _h11_protocol(), "h11_max_incomplete_event_size": max_header, "ws": "none"}
    return {"http": _httptools_protocol(max_header), "ws": "none"}


def header_too_large(max_header: int) -> bytes:
    """The whole 431 response (the connection closes after it)."""
    body = json.dumps({"error": {"message": f"the request's header section is over {max_header} bytes "
                                            "(llamaplug serve --max-header-kib)", "type": "invalid_request_error",
                                 "param": None, "code": "request_header_too_large"}}).encode()
    return (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


def _httptools_protocol(max_header: int) -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    refusal = header_too_large(max_header)

    class CappedHttpTools(HttpToolsProtocol):  # type: ignore[misc]
        """uvicorn's httptools protocol, counting the bytes read while a request's header section is incomplete.

        The count is of whole reads, checked after the parser has taken one: it may pass the cap by
        one read (asyncio reads at most 256 KiB) before the connection is refused and closed.
        """

        _in_head = True
        _head_bytes = 0

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                self._head_bytes += len(data)
            super().data_received(data)
            if self._in_head and self._head_bytes > max_header and not self.transport.is_closing():
                self.transport.write(refusal)
                self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._head_bytes = True, 0

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head, self._head_bytes = True, 0  # the next read may begin the next request

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()
            header_case.title_heads(self.cycle)

    return CappedHttpTools


def _h11_protocol() -> type:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TitledH11(H11Protocol):  # type: ignore[misc]
        """uvicorn's h11 protocol, writing header names as llama-server does (header_case.py)."""

        def handle_events(self) -> None:
            super().handle_events()
            header_case.title_heads(self.cycle)

    return TitledH11
