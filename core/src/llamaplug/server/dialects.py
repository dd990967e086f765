"""One error dialect per API family: its error body, its in-stream error event, and the routes that speak it.

The server speaks five APIs: OpenAI's (/v1/chat/completions, /v1/completions, /v1/embeddings, ...),
llama-server's own (/completion, /tokenize, /slots, ...), Anthropic's Messages (/v1/messages), OpenAI's
Responses (/v1/responses) and Ollama's (/api/...). A client of one reads errors only in that one's shape, so
each family answers in its own. A route module builds its router with its family's `Dialect.router()`: the
router's route class answers every error its routes raise (a body that does not fit included) in that dialect.
An error met before any route runs (a missing API key, an unknown path) takes the dialect of the routes its path belongs
to (`DialectMap`, made from the app's own routes: no list of paths is kept by hand).

The HTTP status is the error's own (`errors.as_api_error`, from the error's class): a dialect only words it.
A new API family is a `Dialect` subclass (its `body`, its `stream_error`) whose `router()` its routes use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute

from ..errors import LlamaError
from .errors import ApiError, as_api_error

_SCALARS = {"str", "int", "float", "bool", "dict", "list", "none", "null"}


class Dialect:
    """OpenAI's: {"error": {"message", "type", "param", "code"}}; in a stream, one `data:` event of that body."""

    name = "openai"
    # Bodies that are unions of typed blocks (the translated APIs): pydantic reports a bad block once per
    # branch it tried, and the error named is the deepest one.
    deepest_fault = False

    def __init__(self) -> None:
        self.route_class: type[DialectRoute] = type(f"{type(self).__name__}Route", (DialectRoute,), {"dialect": self})

    def body(self, error: ApiError) -> dict[str, Any]:
        # llama-server's extra fields (exceed_context_size_error's n_prompt_tokens, n_ctx) ride along
        extra = {k: v for k, v in error.native.items() if k != "type"}
        return {"error": {"message": str(error), "type": error.kind, "param": error.param, "code": error.code,
                          **extra}}

    def response(self, error: ApiError) -> JSONResponse:
        return JSONResponse(self.body(error), status_code=error.status, headers=error.headers)

    def stream_error(self, exc: Exception) -> str:
        """The event that ends a stream `exc` cut after its status line went out, framing included."""
        return f"data: {json.dumps(self.body(as_api_error(exc)), ensure_ascii=False)}\n\n"

    def router(self, **options: Any) -> APIRouter:
        """An APIRouter whose routes answer their errors in this dialect."""
        return APIRouter(route_class=self.route_class, **options)

    def fault(self, exc: Exception) -> ApiError:
        """The API error of what a route raised."""
        if isinstance(exc, ValidationError):  # a request translated for the chat path, where it still does not fit
            exc = RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()])
        if isinstance(exc, RequestValidationError) and self.deepest_fault:
            return _deepest(exc)
        return as_api_error(exc)


# llama-server's error "type" for each status (server-common.cpp's error types).
_NATIVE_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}


class NativeDialect(Dialect):
    """llama-server's: {"error": {"code": status, "message", "type", ...}}, so scripts written for it read ours."""

    name = "native"

    def body(self, error: ApiError) -> dict[str, Any]:
        return {"error": {"code": error.status, "message": str(error),
                          "type": _NATIVE_TYPES.get(error.status, "server_error"), **error.native}}


# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


class AnthropicDialect(Dialect):
    """Anthropic's: {"type": "error", "error": {"type", "message"}}; in a stream, an `event: error`."""

    name = "anthropic"
    deepest_fault = True

    def body(self, error: ApiError) -> dict[str, Any]:
        kind = _ANTHROPIC_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": str(error)}}

    def stream_error(self, exc: Exception) -> str:
        return named_event("error", json.dumps(self.body(as_api_error(exc)), ensure_ascii=False))


class ResponsesDialect(Dialect):
    """OpenAI's Responses: OpenAI's body; in a stream, an `event: error` numbered as the stream's other events
    (the route's reply numbers it: `stream_error` here is the event without its number)."""

    name = "responses"
    deepest_fault = True

    def stream_error(self, exc: Exception) -> str:
        return named_event("error", json.dumps(self.error_event(exc), ensure_ascii=False))

    def error_event(self, exc: Exception) -> dict[str, Any]:
        error = as_api_error(exc)
        return {"type": "error", "code": error.code, "message": str(error), "param": error.param}


class OllamaDialect(Dialect):
    """Ollama's: {"error": "message"}; in an NDJSON stream, one line of that body."""

    name = "ollama"

    def body(self, error: ApiError) -> dict[str, Any]:
        return {"error": str(error)}

    def stream_error(self, exc: Exception) -> str:
        return json.dumps(self.body(as_api_error(exc)), ensure_ascii=False) + "\n"


class DialectRoute(APIRoute):
    """A route answering what it raises itself, in its `dialect` (set on each dialect's own subclass)."""

    dialect: Dialect

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        dialect = self.dialect

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except (ApiError, LlamaError, HTTPException, RequestValidationError, ValidationError) as exc:
                return dialect.response(dialect.fault(exc))

        return answer


OPENAI = Dialect()
NATIVE = NativeDialect()
ANTHROPIC = AnthropicDialect()
RESPONSES = ResponsesDialect()
OLLAMA = OllamaDialect()


def named_event(name: str, payload: str) -> str:
    """One named server-sent event (Anthropic's and the Responses API's streams)."""
    return f"event: {name}\ndata: {payload}\n\n"


class DialectMap:
    """The dialect of a path, from the routes that answer it: an error met before a route ran (no API key, an
    unknown path or method) is worded as that path's routes word theirs."""

    def __init__(self, routes: Iterable[BaseRoute]):
        self._exact: list[tuple[re.Pattern[str], Dialect]] = []
        self._under: list[tuple[str, Dialect]] = []  # a route's fixed start ("/slots" of "/slots/{id_slot}")
        for route in routes:
            if isinstance(route, DialectRoute):
                self._exact.append((route.path_regex, route.dialect))
                start = route.path.split("{")[0].rstrip("/")
                if start:
                    self._under.append((start, route.dialect))
        self._under.sort(key=lambda item: -len(item[0]))

    def __call__(self, path: str) -> Dialect:
        for regex, dialect in self._exact:
            if regex.match(path):
                return dialect
        for start, dialect in self._under:
            if path.startswith(start + "/"):
                return dialect
        return OPENAI


def install(app: FastAPI, routers: Iterable[APIRouter]) -> None:
    """Give the app the dialect map of the routes of `routers` (those it includes), and make `handle` its
    handler of every error a request can end with outside a route (an unknown path or method)."""
    app.state.dialects = DialectMap(route for router in routers for route in router.routes)
    for kind in (ApiError, LlamaError, RequestValidationError, HTTPException):
        app.add_exception_handler(kind, handle)


def dialect_of(request: Request) -> Dialect:
    """The dialect a request's errors are worded in: its route's, else its path's."""
    route = request.scope.get("route")
    if isinstance(route, DialectRoute):
        return route.dialect
    found: DialectMap | None = getattr(request.app.state, "dialects", None)
    return found(request.url.path) if found is not None else OPENAI


async def handle(request: Request, exc: Exception) -> Response:
    dialect = dialect_of(request)
    return dialect.response(dialect.fault(exc))


def _deepest(exc: RequestValidationError) -> ApiError:
    """The API error of a body's deepest fault, its place named without pydantic's union-branch labels."""
    found = list(exc.errors())
    if not found:
        return as_api_error(exc)
    deepest = max(found, key=lambda e: len(e.get("loc", ())))
    loc = tuple(p for p in deepest.get("loc", ()) if not (isinstance(p, str) and ("[" in p or p in _SCALARS)))
    return as_api_error(RequestValidationError([{**deepest, "loc": loc}]))
