"""GET/POST /cors-proxy?url=URL: llama-server's MCP CORS proxy (serve --ui-mcp-proxy), 403 without the flag.

A browser page cannot call an MCP server of another origin that sends no CORS headers; the page asks this server
to make the request for it (llama-server's web UI does so for its MCP servers). As llama-server's
(server-cors-proxy.h): only http(s) URLs without a password; of the request's headers only those the page names
`x-llama-server-proxy-header-NAME` go, as NAME (so the page's key, cookies and the like never leave); the body of a
POST goes as it came; redirects are followed; the answer's status, type and body come back (streamed: an MCP
server may answer with an event stream), without the hop-by-hop and CORS headers (this server adds its own).

An open proxy for whoever can reach the server (and its key): off by default, as llama-server's.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from .api_error import BadGatewayError, BadRequestError, ForbiddenError
from .dialects import NATIVE

router = NATIVE.router()

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT = 600.0  # seconds: llama-server's read and write timeouts
# Not passed on: what a hop sets for itself, and CORS (llama-server's should_strip_proxy_header)
_DROPPED = frozenset({"server", "transfer-encoding", "content-length", "keep-alive", "connection", "date"})
_NOT_SENT = frozenset({"accept-encoding", "transfer-encoding", "content-length", "host", "connection"})
_CHUNK = 64 * 1024


@router.api_route("/cors-proxy", methods=["GET", "POST"])
async def cors_proxy(request: Request) -> Response:
    if not getattr(request.app.state, "ui_mcp_proxy", False):  # llama-server's answer without --ui-mcp-proxy
        raise ForbiddenError("this feature is disabled: serve --ui-mcp-proxy", "feature_disabled")
    target = _target(request.query_params.get("url", ""))
    headers = {k[len(PREFIX):]: v for k, v in request.headers.items()
               if k.startswith(PREFIX) and len(k) > len(PREFIX) and k[len(PREFIX):] not in _NOT_SENT}
    body = await request.body() if request.method == "POST" else None
    ask = urllib.request.Request(target, data=body, headers=headers, method=request.method)
    try:
        answer = await asyncio.to_thread(urllib.request.urlopen, ask, timeout=TIMEOUT)
    except urllib.error.HTTPError as exc:  # a 4xx or 5xx of the target's: passed on as it is
        answer = exc
    except (OSError, ValueError) as exc:
        raise BadGatewayError(f"the proxy could not reach {target!r}: {exc}", param="url") from None
    passed = {k: v for k, v in answer.headers.items()
              if k.lower() not in _DROPPED and not k.lower().startswith("access-control-")
              and k.lower() != "content-type"}
    kind = answer.headers.get("content-type")  # (urllib follows redirects, as llama-server's client)
    if answer.status in (204, 304):
        answer.close()
        return Response(status_code=answer.status, headers=passed, media_type=kind)
    return StreamingResponse(_chunks(answer), status_code=answer.status, headers=passed, media_type=kind)


def _target(url: str) -> str:
    """`url` if the proxy may ask it (llama-server's checks), else a 400 naming what is wrong."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        host, parts = None, None
    if parts is None or not host:
        raise BadRequestError(f"invalid target URL {url[:200]!r}: missing host", param="url")
    if parts.scheme not in ("http", "https"):
        raise BadRequestError(f"unsupported URL scheme in target URL: {parts.scheme!r}", param="url")
    if parts.password:
        raise BadRequestError("authentication in target URL is not supported", param="url")
    return url


def _chunks(answer: Any) -> Iterator[bytes]:
    """The target's body as it comes (Starlette reads a plain iterator in a worker thread)."""
    try:
        while chunk := answer.read1(_CHUNK) if hasattr(answer, "read1") else answer.read(_CHUNK):
            yield chunk
    finally:
        answer.close()
