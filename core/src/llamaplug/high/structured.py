"""A pydantic model as response_format: the JSON-schema constraint it stands for, and the reply parsed into it;
and the structured engine: what turns a JSON schema or a grammar into the sampler that constrains a reply.

    out = llama.create_chat_completion(messages, response_format=Person)
    out.choices[0].message.parsed  # a Person (as OpenAI's beta.chat.completions.parse)
    llama.create_chat_completion(messages, response_format=Person, structured_engine="llguidance")

Engines: "gbnf" (llama.cpp's converter and grammar sampler, as llama-server: the default), "llguidance"
(the sampler the llamaplug-llguidance plugin registers; looked up by name through the sampler hook, so the core
never imports it), "auto" (llguidance when it is installed, else gbnf). The call's `structured_engine` wins
over LlamaParams.structured_engine (`serve --structured-engine`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, get_args

import pydantic

from .. import plugins
from ..blocks.grammar import Grammar
from ..blocks.sampling import LlamaSampler, SamplerChain, plugin_sampler
from ..errors import InvalidParameterError, ReplyValidationError
from ..params import StructuredEngine

if TYPE_CHECKING:
    from ..blocks.model import LlamaModel
    from .completion import Completion

ENGINES = get_args(StructuredEngine)
LLGUIDANCE = "llguidance"  # the name the plugin's sampler is registered under

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


def engine_for(default: str, given: str | None) -> str:
    """"gbnf" or "llguidance": the call's `given` engine (None: `default`, the Llama's), "auto" resolved."""
    engine = default if given is None else given
    if engine not in ENGINES:
        raise InvalidParameterError(f"structured_engine must be one of {', '.join(ENGINES)}, got {engine!r}",
                                    field="structured_engine")
    installed = LLGUIDANCE in plugins.sampler_factories()
    if engine == "auto":
        return LLGUIDANCE if installed else "gbnf"
    if engine == LLGUIDANCE and not installed:
        raise InvalidParameterError("structured_engine \"llguidance\" needs its plugin: pip install "
                                    "llamaplug-llguidance (or use \"auto\" or \"gbnf\")", field="structured_engine")
    return engine


def constraint(model: LlamaModel, engine: str, json_schema: Any = None,
               grammar: str | None = None) -> Grammar | LlamaSampler:
    """What goes in front of a chain (SamplerChain.constrained) for a JSON schema or a GBNF grammar under
    `engine` ("gbnf" or "llguidance", from engine_for). llguidance names a keyword it cannot take
    (InvalidParameterError: 'Unimplemented keys: ["uniqueItems"]'): a schema is never loosened silently."""
    if engine == "gbnf":
        return Grammar.from_json_schema(json_schema) if json_schema is not None else Grammar(grammar or "")
    if json_schema is not None and isinstance(json_schema, bool):
        json_schema = {} if json_schema else {"not": {}}
    options = {"json_schema": json_schema} if json_schema is not None else {"grammar": grammar}
    return plugin_sampler(LLGUIDANCE, model=model, **options)


def constrain(model: LlamaModel, sampler: LlamaSampler | None, engine: str, json_schema: Any = None,
              grammar: str | None = None, field: str = "response_format") -> SamplerChain:
    """`sampler` (None: greedy) with the constraint of `json_schema` or `grammar` in front."""
    if sampler is not None and not isinstance(sampler, SamplerChain):
        raise InvalidParameterError(f"{field} needs a SamplerChain (or no sampler)", field="sampler")
    front = constraint(model, engine, json_schema, grammar)
    try:
        return (sampler if sampler is not None else SamplerChain().greedy()).constrained(front)
    except BaseException:
        if isinstance(front, LlamaSampler):
            front.close()
        raise
