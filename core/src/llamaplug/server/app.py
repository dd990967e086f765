"""The OpenAI-compatible HTTP API over one Llama or several: every client's requests share an engine's batches.

Errors are in each API family's own shape (dialects.py; OpenAI's {"error": {"message", "type", "param",
"code"}} here): bad requests 400 (the field named in `param`), a missing or wrong key 401, an unknown
model 404, a failed decode or backend 500, a closed server or a full queue 503 (with Retry-After). A client
that goes away mid-request (streamed or not) cancels its request: its slot is free at the engine's next step.

The app is put together here: the guard middleware (API key, request counters),
the error dialect of each API family (dialects.py), and one router per resource (routes/), each route
finding its model through one dependency (deps.py) over app.state.models, the
registry that loads and unloads models (registry.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..high.chat import ChatSettings
from ..high.llama import Llama
from . import dialects, error_docs, request_body
from .api_error import ApiError, BodyTooLargeError, ForbiddenError, UnauthorizedError
from .cors import Cors
from .metrics import Metrics
from .registry import ModelRegistry, Served
from .routes import ROUTERS

# bytes (serve's --max-body-mib): a long prompt or an image or two in base64. JSON parsing and the body's
# checks hold the event loop ~25 ms a MiB, and tokenizing a prompt takes ~25 MiB of memory a MiB of text.
DEFAULT_MAX_BODY = 8 * 2**20


def create_app(llama: Llama, model_id: str | None = None, api_key: str | None = None,
               pooling: str | None = None, n_predict: int = -1, slot_save_path: str | None = None,
               chat_template: str | None = None, chat: ChatSettings | None = None,
               max_body: int = DEFAULT_MAX_BODY) -> FastAPI:
    """The ASGI app serving `llama` (closed when the app shuts down).

    `pooling` for /v1/embeddings: default the model's own, and mean for a model that has
    none (a generative model: OpenAI's shape has one vector per input, not one per token).
    `n_predict`: tokens a request that gives no limit may generate, on every route (llama-server's -n;
    -1: until the end). `slot_save_path`: the folder of POST /slots' files (None: save/restore refused).
    `chat_template` overrides the GGUF's; `chat`: the server's chat defaults (--reasoning-format, ...).
    `max_body`: the bytes a request body may have (a longer one is a 413).
    """
    served = Served.of(llama, model_id, pooling, chat_template)
    if chat is not None:
        served.chat = chat
    app = create_app_for(ModelRegistry([served]), api_key, n_predict, slot_save_path, max_body)
    app.state.llama = llama
    return app


def create_app_for(registry: ModelRegistry, api_key: str | None = None, n_predict: int = -1,
                   slot_save_path: str | None = None, max_body: int = DEFAULT_MAX_BODY, cors: Cors | None = None,
                   endpoint_slots: bool = True, webui: bool = True) -> FastAPI:
    """The ASGI app serving the models of `registry`, each loaded when first asked for (closed at shutdown);
    the other arguments as create_app's. `cors`: llama-server's CORS flags (None: its defaults, cors.py);
    `endpoint_slots` False: /slots answers 501, as llama-server's --no-slots; `webui` False: no chat page
    (its paths answer 404, as llama-server's --no-webui)."""
    metrics = Metrics(registry.engines)
    registry.on_unload(metrics.retire)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(registry.close)

    # No redirect from a path with a trailing slash: Starlette's is built from the Host header, and was given
    # without the key under /static/ (llama-server has none either).
    app = FastAPI(title="llamaplug", summary="OpenAI-compatible API over llama.cpp", version=_version(),
                  lifespan=lifespan, redirect_slashes=False)
    app.state.metrics = metrics
    app.state.models = registry
    app.state.n_predict = n_predict
    app.state.slot_save_path = slot_save_path
    app.state.endpoint_slots = endpoint_slots
    app.state.webui = webui
    app.add_middleware(_Guard, api_key=api_key, metrics=metrics, max_body=max_body, cors=cors or Cors())
    for router in ROUTERS:
        app.include_router(router)
    dialects.install(app, ROUTERS)
    error_docs.install(app)

    return app


# What answers without the API key: llama-server's public endpoints, and the chat page's own files (the
# page asks for the key and sends it with its API calls; a browser cannot send it for the page itself).
PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/", "/favicon.ico"})
PUBLIC_PREFIX = "/static/"


class _Guard:
    """The middleware: CORS (cors.py: a preflight is answered here, before the key), the API key on every path
    but /health (when one is set), the HTTP counters of /metrics, and POST bodies read as JSON: read whole
    before the route runs, at most `max_body` bytes (413), and refused (400) where they hold what
    llama-server's JSON parser refuses (request_body.py).

    As llama-server, `Authorization: Bearer KEY` or a bare `Authorization: KEY`. Plain ASGI rather than
    Starlette's BaseHTTPMiddleware: that one wraps every request in a task group and a wrapped `receive`,
    a cost each request paid on the event loop, which shares the CPU with the decode threads.
    """

    def __init__(self, app: ASGIApp, api_key: str | None, metrics: Metrics, max_body: int, cors: Cors):
        self.app, self.api_key, self.metrics, self.max_body, self.cors = app, api_key, metrics, max_body, cors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        metrics, api_key = self.metrics, self.api_key
        metrics.http_requests += 1
        path = scope["path"]
        headers = Headers(scope=scope)
        refused = self.cors.refusal(headers.get("origin"), headers.get("host"), scope.get("server"))
        if refused is not None:  # (cors.py: serve without --api-key)
            metrics.http_errors += 1
            await scope["app"].state.dialects(path).response(ForbiddenError(
                refused[1], param=refused[0], code=f"{refused[0]}_refused"))(scope, receive, send)
            return
        origin = self.cors.allow_origin(headers.get("origin"))
        cors = [(b"access-control-allow-origin", origin.encode("latin-1"))] if origin is not None else []
        if scope["method"] == "OPTIONS":  # a preflight carries no key: llama-server answers every one
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/html"), (b"content-length", b"0"), *cors,
                                    *self.cors.preflight()]})
            await send({"type": "http.response.body", "body": b""})
            return
        if cors:
            send = _with_headers(send, cors)
        if api_key is not None and path not in PUBLIC_PATHS and not path.startswith(PUBLIC_PREFIX):
            given = headers.get("authorization", "").removeprefix("Bearer ")
            if not (secrets.compare_digest(given.encode(), api_key.encode())
                    or secrets.compare_digest(headers.get("x-api-key", "").encode(), api_key.encode())):
                # (Anthropic's clients send the key as x-api-key, not as a bearer token)
                metrics.http_errors += 1
                dialect = scope["app"].state.dialects(path)
                await dialect.response(UnauthorizedError(
                    "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)"))(scope, receive, send)
                return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                metrics.http_errors += 1
            await send(message)

        if scope["method"] == "POST":
            _json_body(scope, headers)
            try:
                body = await self._body(headers, receive)
            except ApiError as exc:
                await scope["app"].state.dialects(path).response(exc)(scope, receive, counted)
                return
            if body is None:  # the client went away before its body was whole
                return
            receive = request_body.replay(body, receive)
        await self.app(scope, receive, counted)

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
    application/x-www-form-urlencoded, and scripts written for llama-server rely on that working."""
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    if kind in ("", "application/x-www-form-urlencoded", "text/plain"):
        scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        scope["headers"].append((b"content-type", b"application/json"))


def _version() -> str:
    from .. import __version__

    return __version__
