"""Vertex AI's prediction protocol, llama-server's Google Cloud Platform compat (on when AIP_MODE=PREDICTION).

POST AIP_PREDICT_ROUTE (default /predict) takes {"instances": [...]} (at most 128), each naming a route by
`@requestFormat`: its camelCase alias ("chatCompletions" for /v1/chat/completions, "applyTemplate" for
/apply-template) or its path. Each instance runs as a POST to that route, concurrently, never streamed, and the answer
is {"predictions": [...]}: each the route's JSON answer, its error body included, as llama-server's. AIP_HTTP_PORT
replaces the port, AIP_HEALTH_ROUTE adds another path for /health.
Ref: https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from ..errors import InvalidParameterError
from .errors import BadRequestError

log = logging.getLogger("llamaplug.server.gcp")
MAX_INSTANCES = 128


@dataclasses.dataclass(frozen=True)
class Gcp:
    predict: str = "/predict"
    health: str | None = None
    port: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Gcp | None:
        """The settings AIP_* give, None unless AIP_MODE is PREDICTION."""
        if env.get("AIP_MODE", "") != "PREDICTION":
            return None
        port = env.get("AIP_HTTP_PORT") or "8080"
        if not (port.isascii() and port.isdigit() and 0 <= int(port) <= 65535):
            raise InvalidParameterError(f"AIP_HTTP_PORT={port!r} is not a port (0..65535)", field="AIP_HTTP_PORT")
        return cls(env.get("AIP_PREDICT_ROUTE") or "/predict", env.get("AIP_HEALTH_ROUTE") or None, int(port))


def _alias(path: str) -> str:
    """llama-server's path_to_gcp_format: "/v1/chat/completions" -> "chatCompletions"."""
    path = path.removeprefix("/v1") if len(path) > 3 else path
    out, cap = [], False
    for c in path.removeprefix("/").split("{", 1)[0]:
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


def _walk(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, APIRoute]]:
    """(path, route) of every API route, those of included routers too (FastAPI keeps those apart)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield prefix + route.path, route
        elif getattr(route, "original_router", None) is not None:
            context = getattr(route, "include_context", None)
            yield from _walk(route.original_router.routes, prefix + (getattr(context, "prefix", "") or ""))


def _error(message: str) -> dict[str, Any]:
    """An instance's answer when it names no route (llama-server's invalid_request_error, in the predictions)."""
    return {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}


def install(app: FastAPI, gcp: Gcp) -> None:
    """Add the predict route (and the health alias) to `app`, after its other routes."""
    routes = list(_walk(app.routes))
    if any(path == gcp.predict for path, _ in routes):
        raise InvalidParameterError(f"AIP_PREDICT_ROUTE={gcp.predict} is one of this server's own routes",
                                    field="AIP_PREDICT_ROUTE")
    aliases: dict[str, str] = {}
    for path, route in routes:  # the first route of an alias wins, as llama-server's
        if "POST" in route.methods:
            aliases.setdefault(_alias(path), path)
    health = next((r for path, r in routes if path == "/health"), None)
    if gcp.health and health is not None:
        app.add_api_route(gcp.health, health.endpoint, methods=["GET"], include_in_schema=False)

    async def predict(request: Request) -> JSONResponse:
        try:
            data = json.loads(await request.body())
        except ValueError as exc:
            raise BadRequestError(f"the body is no JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadRequestError("request body must be a JSON object")
        instances = data.get("instances")
        if not isinstance(instances, list):
            raise BadRequestError("request body must include an array field named instances", param="instances")
        if len(instances) > MAX_INSTANCES:
            raise BadRequestError(f"instances array exceeds maximum size of {MAX_INSTANCES}", param="instances")
        answers = await asyncio.gather(*(_one(app, request, aliases, i) for i in instances))
        return JSONResponse({"predictions": answers})

    app.add_api_route(gcp.predict, predict, methods=["POST"], include_in_schema=False)


async def _one(app: FastAPI, request: Request, aliases: dict[str, str], instance: Any) -> Any:
    if not isinstance(instance, dict):
        return _error("each instance must be a JSON object")
    fmt = instance.get("@requestFormat")
    if not isinstance(fmt, str):
        return _error("each instance must include a string @requestFormat")
    path = aliases.get(fmt) or (fmt if fmt in aliases.values() else None)
    if path is None:
        return _error(f"no handler registered for @requestFormat: {fmt}")
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    if "stream" in payload:
        log.warning("ignoring an instance's stream field: the predict route does not stream")
        payload["stream"] = False
    return await _post(app, request, path, json.dumps(payload).encode())


async def _post(app: FastAPI, outer: Request, path: str, body: bytes) -> Any:
    """POST `body` to `path` through the whole app (its key check, limits and counters too), with the outer
    request's headers; the reply's JSON (its text if it is none, None if empty)."""
    headers = [(k, v) for k, v in outer.scope["headers"] if k not in (b"content-length", b"content-type")]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "asgi": outer.scope.get("asgi", {"version": "3.0"}), "http_version": "1.1",
             "method": "POST", "scheme": outer.scope.get("scheme", "http"), "path": path,
             "raw_path": path.encode(), "root_path": outer.scope.get("root_path", ""), "query_string": b"",
             "headers": headers, "client": outer.scope.get("client"), "server": outer.scope.get("server")}
    sent = False
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect of its own: the outer request's cancels this task
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    data = b"".join(chunks)
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")
