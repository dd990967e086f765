"""What one request may ask of the chat template, the tokenizer and the embedding model: bounds refused with a 400.

The body's size is bounded before any route runs (app.py, --max-body-mib); inside it,
a chat's messages and their text, and an embedding request's inputs, are bounded here
(serve's --max-messages, --max-chars, --max-inputs), each refusal naming the request's field.
A request within them still stops when its client leaves (streaming.off_loop).

Defaults: llama-server bounds none of these; OpenAI takes at most 2048 embedding inputs per
request. llama.cpp's chat layer renders a conversation three times in one native call that
nothing can interrupt (the prompt, then without and with the generation prompt, to diff them;
~0.17 ms a message on a CI core): 10,000 messages bound that call to ~2 s, and a context
holds fewer (a message costs the template's few tokens at least). 4 Mi characters tokenize
in ~4 s, in pieces that stop when the client leaves (blocks/long_text.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from fastapi import Request
from pydantic import BaseModel

from .api_error import BadRequestError

DEFAULT_MAX_MESSAGES = 10_000
DEFAULT_MAX_CHARS = 4 * 2**20
DEFAULT_MAX_INPUTS = 2048  # OpenAI's

# Fields that hold media rather than text (base64 images and audio): not counted as characters.
_MEDIA = frozenset({"image_url", "input_audio", "images", "image", "audio", "source", "file"})


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """The bounds of one server (create_app_for's `limits`)."""

    max_messages: int = DEFAULT_MAX_MESSAGES  # --max-messages: messages (or Responses input items) per request
    max_chars: int = DEFAULT_MAX_CHARS  # --max-chars: characters of their text, all together
    max_inputs: int = DEFAULT_MAX_INPUTS  # --max-inputs: texts per embedding request

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field.name} must be a positive int, got {value!r}")


def limits(request: Request) -> RequestLimits:
    """The app's bounds (RequestLimits() for an app built without them)."""
    found: RequestLimits | None = getattr(request.app.state, "request_limits", None)
    return found if found is not None else RequestLimits()


def check_messages(request: Request, messages: Sequence[Any], field: str, *extra: Any) -> None:
    """400 naming `field` for more messages, or more text in them (and in `extra`: a system prompt, instructions),
    than the server takes. The count is of what the client sent; the text is walked in one pass."""
    bounds = limits(request)
    if len(messages) > bounds.max_messages:
        raise BadRequestError(f"{field} has {len(messages)} items; this server takes at most "
                              f"{bounds.max_messages} (llamaplug serve --max-messages)", param=field,
                              code="too_many_messages")
    _check_chars(bounds, field, text_chars(extra) + text_chars(messages))


def check_inputs(request: Request, texts: Sequence[Any], field: str) -> None:
    """400 naming `field` for more embedding inputs, or more text in them, than the server takes."""
    bounds = limits(request)
    if len(texts) > bounds.max_inputs:
        raise BadRequestError(f"{field} has {len(texts)} inputs; this server takes at most {bounds.max_inputs} "
                              "per request (llamaplug serve --max-inputs)", param=field, code="too_many_inputs")
    _check_chars(bounds, field, text_chars(texts))


def _check_chars(bounds: RequestLimits, field: str, n: int) -> None:
    if n > bounds.max_chars:
        raise BadRequestError(f"{field} holds {n} characters of text; this server takes at most "
                              f"{bounds.max_chars} per request (llamaplug serve --max-chars)", param=field,
                              code="too_many_characters")


def text_chars(value: Any) -> int:
    """Characters of every string in `value` (dicts, lists, pydantic models), media fields left out."""
    total = 0
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            todo.extend(v for k, v in item.items() if k not in _MEDIA)
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
        elif isinstance(item, BaseModel):
            todo.extend(v for k, v in item.__dict__.items() if k not in _MEDIA)
            if item.__pydantic_extra__:
                todo.extend(v for k, v in item.__pydantic_extra__.items() if k not in _MEDIA)
    return total
