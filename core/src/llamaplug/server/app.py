"""The OpenAI-compatible HTTP API over one Llama: every client's requests share the engine's batches.

Errors are OpenAI's shape ({"error": {"message", "type", "param", "code"}}): bad
requests 400 (the field named in `param`), a missing or wrong key 401, an unknown
model 404, a closed server 503. A client that goes away mid-request (streamed or
not) cancels its request: its slot is free at the engine's next step.

The app is put together here: the guard middleware (API key, request counters), the
one error handler (errors.py), and one router per resource (routes/), each route
finding its model through one dependency (deps.py) over app.state.models.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response

from ..high.llama import Llama
from . import errors
from .metrics import Metrics
from .registry import ModelRegistry, Served
from .routes import ROUTERS


def create_app(llama: Llama, model_id: str | None = None, api_key: str | None = None,
               pooling: str | None = None) -> FastAPI:
    """The ASGI app serving `llama` (closed when the app shuts down).

    `pooling` for /v1/embeddings: default the model's own, and mean for a model that has
    none (a generative model: OpenAI's shape has one vector per input, not one per token).
    """
    registry = ModelRegistry([Served.of(llama, model_id, pooling)])
    metrics = Metrics(llama.engine)
    app = FastAPI(title="llamaplug", summary="OpenAI-compatible API over llama.cpp", version=_version())
    app.state.llama = llama
    app.state.metrics = metrics
    app.state.models = registry
    app.middleware("http")(_guard(api_key, metrics))
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)

    @app.on_event("shutdown")
    async def close() -> None:
        await asyncio.to_thread(registry.close)

    return app


def _guard(api_key: str | None, metrics: Metrics
           ) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    """The middleware: the API key on /v1/ paths (when one is set), and the HTTP counters of /metrics."""

    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        metrics.http_requests += 1
        if api_key is not None and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "")
            if not (secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode())
                    or _x_api_key_matches(request, api_key)):
                metrics.http_errors += 1
                return errors.response(errors.ApiError(
                    401, "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)",
                    "authentication_error", code="invalid_api_key"))
        response = await call_next(request)
        if response.status_code >= 400:
            metrics.http_errors += 1
        return response

    return guard


def _x_api_key_matches(request: Request, api_key: str) -> bool:
    """Anthropic's clients send the key as `x-api-key`, not as a bearer token."""
    return secrets.compare_digest(request.headers.get("x-api-key", "").encode(), api_key.encode())


def _version() -> str:
    from .. import __version__

    return __version__
