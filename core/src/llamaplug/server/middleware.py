"""The app's middlewares, one job each, outermost first: the HTTP counters of /metrics (`Counted`), CORS
(`CorsGuard`: a refused origin and a preflight answered here, before the key), the API key (`KeyGuard`), and POST
bodies read whole as JSON (`JsonBody`).

Plain ASGI rather than Starlette's BaseHTTPMiddleware: that one wraps every request in a task group and a wrapped
`receive`, a cost each request paid on the event loop, which shares the CPU with the decode threads.
"""

from __future__ import annotations

import secrets

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import media_path, request_body
from .api_error import ApiError, BodyTooLargeError, ForbiddenError, UnauthorizedError
from .cors import Cors
from .metrics import Metrics
from .response_store import owner_of

# What answers without the API key: llama-server's public endpoints, and the chat page's own files (the
# page asks for the key and sends it with its API calls; a browser cannot send it for the page itself).
PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/", "/favicon.ico"})
PUBLIC_PREFIX = "/static/"


async def _refuse(error: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer `error` in the dialect of the routes the request's path belongs to (dialects.py)."""
    await scope["app"].state.dialects(scope["path"]).response(error)(scope, receive, send)


class Counted:
    """The HTTP counters of /metrics: every request, and every answer of status 400 and up."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        metrics = self.metrics
        metrics.http_requests += 1

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                metrics.http_errors += 1
            await send(message)

        await self.app(scope, receive, counted)


class CorsGuard:
    """CORS (cors.py): an origin the server's flags refuse is a 403, a preflight is answered here (it carries no
    key: llama-server answers every one), and an allowed origin gets its header on the answer."""

    def __init__(self, app: ASGIApp, cors: Cors):
        self.app, self.cors = app, cors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refused = self.cors.refusal(headers.get("origin"), headers.get("host"), scope.get("server"))
        if refused is not None:  # (cors.py: serve without --api-key)
            await _refuse(ForbiddenError(refused[1], param=refused[0], code=f"{refused[0]}_refused"),
                          scope, receive, send)
            return
        origin = self.cors.allow_origin(headers.get("origin"))
        cors = [(b"access-control-allow-origin", origin.encode("latin-1"))] if origin is not None else []
        if scope["method"] == "OPTIONS":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/html"), (b"content-length", b"0"), *cors,
                                    *self.cors.preflight()]})
            await send({"type": "http.response.body", "body": b""})
            return
        if cors:
            send = _with_headers(send, cors)
        await self.app(scope, receive, send)


class KeyGuard:
    """The API key on every path but the public ones, when one is set: as llama-server, `Authorization: Bearer
    KEY` or a bare `Authorization: KEY`; as Anthropic's clients send it, `x-api-key: KEY`. Several keys
    comma-separated, as llama-server's --api-key; the request's state gets `key_owner`, the hash of the key it
    gave (response_store.owner_of: whose kept responses it may read)."""

    def __init__(self, app: ASGIApp, api_key: str | None):
        self.app = app
        self.keys = None if api_key is None else [(k.encode(), owner_of(k)) for k in api_key.split(",") if k]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        keys, path = self.keys, scope.get("path", "")
        if (scope["type"] != "http" or keys is None or path in PUBLIC_PATHS
                or path.startswith(PUBLIC_PREFIX)):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        given = headers.get("authorization", "").removeprefix("Bearer ").encode()
        other = headers.get("x-api-key", "").encode()
        owner = next((o for k, o in keys if secrets.compare_digest(given, k) or secrets.compare_digest(other, k)),
                     None)
        if owner is None:
            await _refuse(UnauthorizedError("missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)"),
                          scope, receive, send)
            return
        scope.setdefault("state", {})["key_owner"] = owner
        await self.app(scope, receive, send)


class JsonBody:
    """POST bodies read as JSON, whatever their Content-Type says: read whole before the route runs, at most
    `max_body` bytes (413), and refused (400) where they hold what llama-server's JSON parser refuses
    (request_body.py); a media `file://` URL in them is read here from the app's --media-path, or refused
    (media_path.py)."""

    def __init__(self, app: ASGIApp, max_body: int):
        self.app, self.max_body = app, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Ollama's DELETE /api/delete has a body too (its docs: `curl -X DELETE .../api/delete -d '{...}'`)
        if scope["type"] != "http" or not (scope["method"] == "POST" or
                                           (scope["method"] == "DELETE" and scope["path"].startswith("/api/"))):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        _json_body(scope, headers)
        try:
            body = await self._body(headers, receive)
            if body is not None and scope["path"] not in media_path.NOT_MEDIA:
                given, body = body, await media_path.local_media(body, getattr(scope["app"].state, "media_path", None))
                if body is not given:
                    scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
                    scope["headers"].append((b"content-length", str(len(body)).encode()))
        except ApiError as exc:
            await _refuse(exc, scope, receive, send)
            return
        if body is None:  # the client went away before its body was whole
            return
        await self.app(scope, request_body.replay(body, receive), send)

    async def _body(self, headers: Headers, receive: Receive) -> bytes | None:
        too_large = BodyTooLargeError(f"the request body is over {self.max_body} bytes (llamaplug serve "
                                      "--max-body-mib)", param="body",
                                      headers={"Connection": "close"})  # the rest of the body is not read
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            raise too_large
        try:
            body = await request_body.read_body(receive, self.max_body)
        except request_body.BodyTooLarge:
            raise too_large from None
        if body is not None:
            await request_body.check_json(body)
        return body


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    """`send` adding `extra` to the response's headers."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sending


def _json_body(scope: Scope, headers: Headers) -> None:
    """A POST body is JSON whatever its Content-Type says, as llama-server reads it: `curl -d` sends
    application/x-www-form-urlencoded, and scripts written for llama-server (or Ollama) rely on that working."""
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    # Ollama's server reads its /api/* bodies as JSON whatever the type says (its handlers decode the body itself)
    if kind in ("", "application/x-www-form-urlencoded", "text/plain") or scope["path"].startswith("/api/"):
        scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        scope["headers"].append((b"content-type", b"application/json"))
