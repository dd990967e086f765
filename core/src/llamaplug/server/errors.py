"""The API's errors: what a request failed with, as an HTTP status and the fields every error body words.

A route raises what it has: an `ApiError` for a fault the server itself finds (an
empty input, an unknown model), or the library's own `LlamaError`; FastAPI raises
`RequestValidationError` for a body that does not fit the schema and `HTTPException`
for an unknown path or method. `as_api_error` is the one place that gives each its
status: a `LlamaError` by its class (`STATUS_BY_CLASS`: the client's fault, 400,
unless listed). How each API family words an error is its dialect's (dialects.py).
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from ..errors import (
    BackendError,
    ClosedError,
    ContextOverflowError,
    DecodeError,
    EngineError,
    LlamaError,
    ModelNotFoundError,
)
from .api_error import ApiError
from .error_docs import error_responses
from .schemas import ErrorBody

# For a route's `responses=`: the statuses its errors may have, in the OpenAPI document.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = error_responses(ErrorBody, (400, 401, 404, 500, 503))

# The LlamaErrors that are not the client's fault, by class (the nearest in an error's MRO): (status, OpenAI's
# error "type", code). Any other LlamaError is a bad request: 400, naming its field.
STATUS_BY_CLASS: dict[type[LlamaError], tuple[int, str, str]] = {
    ClosedError: (503, "server_error", "closed"),  # closed or shutting down: another replica or a retry may serve
    ModelNotFoundError: (404, "invalid_request_error", "model_not_found"),
    DecodeError: (500, "server_error", "decode_failed"),
    EngineError: (500, "server_error", "engine_failed"),
    BackendError: (500, "server_error", "backend_failed"),
}


def as_api_error(exc: Exception) -> ApiError:
    """The status and error shape of what a request raised."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextOverflowError) and hasattr(exc, "n_prompt_tokens"):
        return exceeds_context(exc.n_prompt_tokens, exc.n_ctx)  # type: ignore[attr-defined]
    if isinstance(exc, LlamaError):
        for kind in type(exc).__mro__:
            if kind in STATUS_BY_CLASS:
                status, error_type, code = STATUS_BY_CLASS[kind]
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
    raise TypeError(f"no API error for {type(exc).__name__}")  # dialects.install handles the kinds above only


def exceeds_context(n_prompt: int, n_ctx: int, param: str | None = "messages") -> ApiError:
    """llama-server's error for a prompt longer than a slot: its message, type, n_prompt_tokens and n_ctx."""
    return ApiError(400, f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), try "
                         "increasing it", "exceed_context_size_error", param=param, code="exceed_context_size_error",
                    native={"type": "exceed_context_size_error", "n_prompt_tokens": n_prompt, "n_ctx": n_ctx})
