"""A pydantic model as response_format: the JSON-schema constraint it stands for, and the reply parsed into it.

    out = llama.create_chat_completion(messages, response_format=Person)
    out.choices[0].message.parsed  # a Person (as OpenAI's beta.chat.completions.parse)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pydantic

from ..errors import ReplyValidationError

if TYPE_CHECKING:
    from .completion import Completion

# What response_format takes: OpenAI's dict, or a pydantic model (class) whose JSON schema constrains the reply.
ResponseFormat = dict[str, Any] | type[pydantic.BaseModel]


def model_class(response_format: Any) -> type[pydantic.BaseModel] | None:
    """The pydantic model `response_format` is (None when it is a dict or None)."""
    if isinstance(response_format, type) and issubclass(response_format, pydantic.BaseModel):
        return response_format
    return None


def as_response_format(response_format: Any) -> Any:
    """OpenAI's json_schema response_format for a pydantic model; anything else as given."""
    cls = model_class(response_format)
    if cls is None:
        return response_format
    return {"type": "json_schema", "json_schema": {"name": cls.__name__, "schema": cls.model_json_schema(),
                                                   "strict": True}}


def parse_reply(cls: type[pydantic.BaseModel], content: str | None, finish_reason: str) -> pydantic.BaseModel:
    """`content` validated as a `cls`; a reply that does not fit raises ReplyValidationError naming the field."""
    try:
        return cls.model_validate_json(content or "")
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        where = f"field {field!r}" if field else "the reply"
        hint = " (the reply was cut at max_tokens: raise it)" if finish_reason == "length" else ""
        raise ReplyValidationError(f"response_format {cls.__name__}: {where}: {first['msg']}{hint}",
                                   field=field) from None


def with_parsed(completion: Completion, response_format: Any) -> Completion:
    """`completion` with .parsed, the reply as a `response_format` pydantic model (as given without one)."""
    cls = model_class(response_format)
    if cls is None:
        return completion
    finish = "length" if completion.stop_reason.value == "max_tokens" else "stop"
    return dataclasses.replace(completion, parsed=parse_reply(cls, completion.text, finish))
