"""The route class of the APIs translated onto the chat path (Anthropic's Messages, OpenAI's Responses).

Their bodies are unions of typed blocks, and pydantic reports a bad block once per
branch it tried ("content: not a string", then the block's real fault): the error
named is the deepest one, without the branch labels. FastAPI's error handlers are the
app's; a route class is how one family of routes answers its own errors, so a family
with its own error shape (Anthropic's) overrides `shape`.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from ..errors import LlamaError
from . import errors
from .errors import ApiError, as_api_error

_SCALARS = {"str", "int", "float", "bool", "dict", "list", "none", "null"}


class TranslatedRoute(APIRoute):
    """A route answering its errors itself: `shape` of the error (OpenAI's by default)."""

    def shape(self, error: ApiError) -> Response:
        return errors.response(error)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return self.shape(clearest(exc))
            except ValidationError as exc:  # the request translated for the chat path, where it still does not fit
                return self.shape(clearest(RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                                                   for e in exc.errors()])))
            except (ApiError, LlamaError, HTTPException) as exc:
                return self.shape(as_api_error(exc))

        return answer


def clearest(exc: RequestValidationError) -> ApiError:
    """The API error of a body's deepest fault, its place named without pydantic's union-branch labels."""
    found = list(exc.errors())
    if not found:
        return as_api_error(exc)
    deepest = max(found, key=lambda e: len(e.get("loc", ())))
    loc = tuple(p for p in deepest.get("loc", ()) if not (isinstance(p, str) and ("[" in p or p in _SCALARS)))
    return as_api_error(RequestValidationError([{**deepest, "loc": loc}]))
