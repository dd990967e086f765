"""The API's errors: one shape ({"error": {"message", "type", "param", "code"}}, as OpenAI's) and one mapping to it.

A route raises what it has: an `ApiError` for a fault the server itself finds (an
empty input, an unknown model), or the library's own `LlamaError`; FastAPI raises
`RequestValidationError` for a body that does not fit the schema and `HTTPException`
for an unknown path or method. `install` makes `handle` the handler of all four, and
`as_api_error` is the one place that gives each its status and shape.

llama-server's own routes (/completion, /tokenize, /slots, ...: `NATIVE_PATHS`) answer
in llama-server's shape instead, {"error": {"code": status, "message", "type"}}, so
scripts written for it read our errors as they read its own.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..errors import ClosedError, ContextOverflowError, LlamaError
from .schemas import ErrorBody

# For a route's `responses=`: the statuses its errors may have, in the OpenAPI document.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 401, 404, 503)}

# LlamaError subclasses that are not the client's fault: (status, type, code). Any other is a 400 naming its field.
_NOT_THE_CLIENTS: dict[type[LlamaError], tuple[int, str, str]] = {
    ClosedError: (503, "server_error", "closed"),
}


# Paths (and their prefixes) of llama-server's own API, whose errors take its shape (see `response`).
NATIVE_PATHS = ("/completion", "/infill", "/tokenize", "/detokenize", "/apply-template", "/props", "/slots",
                "/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/embedding")

# llama-server's error "type" for each status (server-common.cpp's error types).
_NATIVE_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 501: "not_supported_error", 503: "unavailable_error"}


class ApiError(Exception):
    """An error response: HTTP `status`, OpenAI's error `kind` (its "type"), the request field `param`, a `code`.

    `native` holds what llama-server's shape has beyond code/message/type (its own "type" included, where the
    status alone does not say it: "exceed_context_size_error" with n_prompt_tokens and n_ctx). `headers` go
    with it (Retry-After on a 503 of a full queue).
    """

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, native: dict[str, Any] | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code
        self.native = native or {}
        self.headers = headers


def as_api_error(exc: Exception) -> ApiError:
    """The status and error shape of what a request raised."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextOverflowError) and hasattr(exc, "n_prompt_tokens"):
        return exceeds_context(exc.n_prompt_tokens, exc.n_ctx)  # type: ignore[attr-defined]
    if isinstance(exc, LlamaError):
        for kind in type(exc).__mro__:
            if kind in _NOT_THE_CLIENTS:
                status, error_type, code = _NOT_THE_CLIENTS[kind]
                return ApiError(status, str(exc), error_type, code=code)
        return ApiError(400, str(exc), param=getattr(exc, "field", None), code=type(exc).__name__)
    if isinstance(exc, RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        if first.get("type") == "json_invalid":
            return ApiError(400, f"the body is not valid JSON: {first.get('msg', '')}", param="body")
        return ApiError(400, f"{where or 'body'}: {first.get('msg', 'invalid')}", param=where)
    if isinstance(exc, HTTPException):
        return ApiError(exc.status_code, str(exc.detail))
    raise TypeError(f"no API error for {type(exc).__name__}")  # install() registers `handle` for the kinds above only


def exceeds_context(n_prompt: int, n_ctx: int, param: str | None = "messages") -> ApiError:
    """llama-server's error for a prompt longer than a slot: its message, type, n_prompt_tokens and n_ctx."""
    return ApiError(400, f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), try "
                         "increasing it", "exceed_context_size_error", param=param, code="exceed_context_size_error",
                    native={"type": "exceed_context_size_error", "n_prompt_tokens": n_prompt, "n_ctx": n_ctx})


def response(exc: ApiError, path: str = "") -> JSONResponse:
    """`exc` as the body of the API that `path` is part of: llama-server's shape on NATIVE_PATHS, else OpenAI's."""
    body: dict[str, Any]
    if is_native(path):
        body = {"error": {"code": exc.status, "message": str(exc),
                          "type": _NATIVE_TYPES.get(exc.status, "server_error"), **exc.native}}
    else:
        body = {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.code,
                          **{k: v for k, v in exc.native.items() if k != "type"}}}
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


def is_native(path: str) -> bool:
    """Whether `path` is one of llama-server's own routes (NATIVE_PATHS)."""
    return any(path == p or path.startswith(p + "/") or (p == "/embedding" and path == "/embeddings")
               or (p == "/completion" and path == "/completions") for p in NATIVE_PATHS)


async def handle(request: Request, exc: Exception) -> JSONResponse:
    return response(as_api_error(exc), request.url.path)


def install(app: FastAPI) -> None:
    """Make `handle` the app's handler of every error a request can end with."""
    for kind in (ApiError, LlamaError, RequestValidationError, HTTPException):
        app.add_exception_handler(kind, handle)


def in_stream(exc: LlamaError) -> str:
    """An error once a stream's status line is sent: it goes in the stream, as one event's JSON."""
    return json.dumps({"error": {"message": str(exc), "type": "server_error", "code": type(exc).__name__}})
