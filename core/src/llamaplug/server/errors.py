"""The API's errors: what a request failed with, as an HTTP status and the fields every error body words.

A route raises what it has: an `ApiError` for a fault the server itself finds (an
empty input, an unknown model), or the library's own `LlamaError`; FastAPI raises
`RequestValidationError` for a body that does not fit the schema and `HTTPException`
for an unknown path or method. `as_api_error` is the one place that gives each its
status: a `LlamaError` by its class (`STATUS_BY_CLASS`, api_error.py: the client's fault, 400,
unless listed), as the server's own typed errors (`QueueFullError`, ...) have theirs. How each API
family words an error is its dialect's (dialects.py).
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from ..errors import ContextOverflowError, LlamaError
from .api_error import (
    STATUS_BY_CLASS,
    ApiError,
    BadRequestError,
    ClientGoneError,
    ForbiddenError,
    NotFoundError,
    NotSupportedError,
    ServerFaultError,
    UnavailableError,
    status_of,
)
from .error_docs import error_responses
from .openai.schemas import ErrorBody

__all__ = ["ERROR_RESPONSES", "STATUS_BY_CLASS", "ApiError", "BadRequestError", "ClientGoneError", "ForbiddenError",
           "NotFoundError", "NotSupportedError", "ServerFaultError", "UnavailableError", "as_api_error",
           "exceeds_context"]

# For a route's `responses=`: the statuses its errors may have, in the OpenAPI document.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = error_responses(ErrorBody, (400, 401, 404, 500, 503))


def as_api_error(exc: Exception) -> ApiError:
    """The status and error shape of what a request raised."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextOverflowError) and hasattr(exc, "n_prompt_tokens"):
        return exceeds_context(exc.n_prompt_tokens, exc.n_ctx)  # type: ignore[attr-defined]
    if isinstance(exc, LlamaError):
        status, error_type, code = status_of(type(exc))
        if code is None:  # the client's fault (a LlamaError not listed): its field named, and its class
            return BadRequestError(str(exc), param=getattr(exc, "field", None), code=type(exc).__name__)
        return ApiError(status, str(exc), error_type or "server_error", code=code)
    if isinstance(exc, RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = tuple(first.get("loc", ())[1:])
        tag = str(first.get("ctx", {}).get("discriminator", "")).strip("'")
        if first.get("type") in ("union_tag_invalid", "union_tag_not_found") and tag.isidentifier():
            # a union tagged by a field picks its member by that field, and the field is what was wrong:
            # "tools.0.type" (a union picked by a function, "_item_type()", names the item only)
            loc += (tag,)
        where = ".".join(str(p) for p in loc) or None
        if first.get("type") == "json_invalid":
            return BadRequestError(f"the body is not valid JSON: {first.get('msg', '')}", param="body")
        return BadRequestError(f"{where or 'body'}: {first.get('msg', 'invalid')}", param=where)
    if isinstance(exc, HTTPException):
        return ApiError(exc.status_code, str(exc.detail))
    raise TypeError(f"no API error for {type(exc).__name__}")  # dialects.install handles the kinds above only


def exceeds_context(n_prompt: int, n_ctx: int, param: str | None = "messages") -> ApiError:
    """llama-server's error for a prompt longer than a slot: its message, type, n_prompt_tokens and n_ctx."""
    return BadRequestError(f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), "
                           "try increasing it", "exceed_context_size_error", param=param,
                           code="exceed_context_size_error",
                           native={"type": "exceed_context_size_error", "n_prompt_tokens": n_prompt, "n_ctx": n_ctx})
