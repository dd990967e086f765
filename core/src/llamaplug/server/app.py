"""The OpenAI-compatible HTTP API over one Llama or several: every client's requests share an engine's batches.

Errors are OpenAI's shape ({"error": {"message", "type", "param", "code"}}): bad
requests 400 (the field named in `param`), a missing or wrong key 401, an unknown
model 404, a closed server or a full queue 503 (with Retry-After). A client that goes away mid-request (streamed or
not) cancels its request: its slot is free at the engine's next step.

The app is put together here: the guard middleware (API key, request counters), the
one error handler (errors.py), and one router per resource (routes/), each route
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

from ..high.llama import Llama
from . import errors
from .metrics import Metrics
from .registry import ModelRegistry, Served
from .routes import ROUTERS


def create_app(llama: Llama, model_id: str | None = None, api_key: str | None = None,
               pooling: str | None = None, n_predict: int = -1, slot_save_path: str | None = None) -> FastAPI:
    """The ASGI app serving `llama` (closed when the app shuts down).

    `pooling` for /v1/embeddings: default the model's own, and mean for a model that has
    none (a generative model: OpenAI's shape has one vector per input, not one per token).
    `n_predict`: tokens a request that gives no limit may generate, on every route (llama-server's -n;
    -1: until the end). `slot_save_path`: the folder of POST /slots' files (None: save/restore refused).
    """
    app = create_app_for(ModelRegistry([Served.of(llama, model_id, pooling)]), api_key, n_predict, slot_save_path)
    app.state.llama = llama
    return app


def create_app_for(registry: ModelRegistry, api_key: str | None = None, n_predict: int = -1,
                   slot_save_path: str | None = None) -> FastAPI:
    """The ASGI app serving the models of `registry`, each loaded when first asked for (closed at shutdown);
    the other arguments as create_app's."""
    metrics = Metrics(registry.engines)
    registry.on_unload(metrics.retire)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(registry.close)

    app = FastAPI(title="llamaplug", summary="OpenAI-compatible API over llama.cpp", version=_version(),
                  lifespan=lifespan)
    app.state.metrics = metrics
    app.state.models = registry
    app.state.n_predict = n_predict
    app.state.slot_save_path = slot_save_path
    app.add_middleware(_Guard, api_key=api_key, metrics=metrics)
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)

    return app


# What answers without the API key: llama-server's public endpoints, and the chat page's own files (the
# page asks for the key and sends it with its API calls; a browser cannot send it for the page itself).
PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/", "/favicon.ico"})
PUBLIC_PREFIX = "/static/"


class _Guard:
    """The middleware: the API key on every path but /health (when one is set), the HTTP counters of /metrics,
    and POST bodies read as JSON.

    As llama-server, `Authorization: Bearer KEY` or a bare `Authorization: KEY`. Plain ASGI rather than
    Starlette's BaseHTTPMiddleware: that one wraps every request in a task group and a wrapped `receive`,
    a cost each request paid on the event loop, which shares the CPU with the decode threads.
    """

    def __init__(self, app: ASGIApp, api_key: str | None, metrics: Metrics):
        self.app, self.api_key, self.metrics = app, api_key, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        metrics, api_key = self.metrics, self.api_key
        metrics.http_requests += 1
        path = scope["path"]
        headers = Headers(scope=scope)
        if api_key is not None and path not in PUBLIC_PATHS and not path.startswith(PUBLIC_PREFIX):
            given = headers.get("authorization", "").removeprefix("Bearer ")
            if not (secrets.compare_digest(given.encode(), api_key.encode())
                    or secrets.compare_digest(headers.get("x-api-key", "").encode(), api_key.encode())):
                # (Anthropic's clients send the key as x-api-key, not as a bearer token)
                metrics.http_errors += 1
                await errors.response(errors.ApiError(
                    401, "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)",
                    "authentication_error", code="invalid_api_key"), path)(scope, receive, send)
                return
        if scope["method"] == "POST":
            _json_body(scope, headers)

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                metrics.http_errors += 1
            await send(message)

        await self.app(scope, receive, counted)


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
