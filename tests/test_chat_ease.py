"""Python functions as tools, a pydantic model as response_format, and tool calls streamed as OpenAI deltas.

The references: docstring_parser (an independent docstring reader) for the descriptions,
jsonschema for the schemas, non-streamed replies for what streamed deltas must join to, and the real
openai client (its own stream accumulator) for the server's stream. How each template's calls are
read is llama.cpp's chat layer's: tests/test_chat_templates.py checks it template by template.
"""

from __future__ import annotations

import enum
import json
from typing import Literal, Optional

import docstring_parser
import jsonschema
import openai
import pydantic
import pytest
from llamaplug_testing import llamaplug_server
from llamaplug_testing.chat_replies import few_shot

import fetch
import llamaplug as lp
from llamaplug.high.structured import as_response_format
from llamaplug.high.tool_schema import parse_docstring

TEMPLATES = fetch.materialise() / "models" / "templates"
HERMES_TEMPLATE = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Place(pydantic.BaseModel):
    city: str
    country: Optional[str] = None  # noqa: UP045 (Optional is one of the hints under test)


def get_weather(city: str, unit: Unit = Unit.CELSIUS) -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name,
            as people write it.
        unit (Unit): The temperature unit.

    Returns:
        str: the weather.
    """
    return f"sunny in {city} ({unit.value})"


def get_time(zone: Literal["UTC", "CET", "EST"]) -> str:
    """The time now in a time zone.

    Args:
        zone: The time zone.
    """
    return f"noon {zone}"


def every_hint(place: Place, days: int, scale: float, exact: bool, tags: list[str], extra: dict,
               mode: Literal["fast", "slow"] = "fast", unit: Unit = Unit.CELSIUS, note: Optional[str] = None,  # noqa: UP045
               counts: list[int] | None = None) -> None:
    """Every kind of hint.

    Parameters
    ----------
    place : Place
        Where.
    days : int
        How many days
        ahead.
    mode : {"fast", "slow"}, optional
        How hard to try.
    """


def test_a_function_becomes_a_tool_schema_from_its_signature_and_docstring():
    tool = lp.function_tool(every_hint)
    fn = tool["function"]
    assert tool["type"] == "function" and fn["name"] == "every_hint" and fn["description"] == "Every kind of hint."
    params = fn["parameters"]
    jsonschema.Draft202012Validator.check_schema(params)
    assert params["type"] == "object"
    assert params["required"] == ["place", "days", "scale", "exact", "tags", "extra"]  # the ones without a default
    props = params["properties"]
    assert list(props) == ["place", "days", "scale", "exact", "tags", "extra", "mode", "unit", "note", "counts"]
    assert props["days"]["type"] == "integer" and props["scale"]["type"] == "number"
    assert props["exact"]["type"] == "boolean" and props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["extra"]["type"] == "object"
    assert props["mode"]["enum"] == ["fast", "slow"] and props["mode"]["default"] == "fast"
    assert props["days"]["description"] == "How many days ahead."
    assert "title" not in json.dumps(params)  # pydantic's titles are noise to a model
    good = {"place": {"city": "Oslo"}, "days": 2, "scale": 1.5, "exact": True, "tags": ["a"], "extra": {"k": 1},
            "mode": "slow", "unit": "fahrenheit", "note": None, "counts": [1, 2]}
    jsonschema.validate(good, params)
    for bad in ({**good, "mode": "medium"}, {**good, "unit": "kelvin"}, {**good, "place": {"country": "NO"}},
                {k: v for k, v in good.items() if k != "days"}, {**good, "tags": "a"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, params)
    assert "$ref" not in json.dumps(params)  # self-contained: a forced call's grammar nests it in a larger schema
    assert props["place"]["properties"]["city"] == {"type": "string"}
    lp.Grammar.from_json_schema(params)  # what a forced call's grammar is built from


@pytest.mark.parametrize("fn", [get_weather, get_time, every_hint])
def test_docstring_descriptions_are_docstring_parsers(fn):
    summary, described = parse_docstring(fn.__doc__)
    reference = docstring_parser.parse(fn.__doc__)
    assert summary == reference.short_description
    assert described == {p.arg_name: " ".join(p.description.split()) for p in reference.params}


def test_tools_that_cannot_be_schemas_name_the_tool():
    def star(*values: int) -> None: ...

    class NoSchema:
        pass

    def opaque(thing: NoSchema) -> None: ...

    for fn, where in ((lambda x: x, "<lambda>"), (star, "star"), (opaque, "opaque")):
        with pytest.raises(lp.InvalidParameterError, match=f"tools: {where}") as err:
            lp.function_tool(fn)
        assert err.value.field == "tools"


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    age: int
    languages: list[Literal["English", "French", "German"]] = pydantic.Field(max_length=3)


PERSON_ASK = [{"role": "user", "content": "Describe a French teacher as JSON: name, age, languages."}]


def test_a_pydantic_response_format_is_the_json_schema_and_comes_back_parsed(llama):
    out = llama.create_chat_completion(PERSON_ASK, response_format=Person, max_tokens=80)
    message = out.choices[0].message
    assert isinstance(message.parsed, Person)
    assert message.parsed == Person.model_validate_json(message.content)
    assert "parsed" not in out.model_dump()["choices"][0]["message"]  # OpenAI's JSON is unchanged
    # The class stands for OpenAI's json_schema response_format (the one grammar path).
    assert as_response_format(Person) == {"type": "json_schema", "json_schema": {
        "name": "Person", "schema": Person.model_json_schema(), "strict": True}}


def test_a_reply_that_does_not_validate_names_the_field(llama):
    class Picky(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        age: int

        @pydantic.field_validator("age")
        @classmethod
        def ancient(cls, age: int) -> int:  # not in the JSON schema: the grammar cannot enforce it
            if age < 10_000:
                raise ValueError("must be at least 10000")
            return age

    with pytest.raises(lp.ReplyValidationError, match="Picky: field 'age'") as err:
        llama.create_chat_completion(PERSON_ASK, response_format=Picky, max_tokens=80)
    assert err.value.field == "age" and isinstance(err.value, lp.LlamaError)
    with pytest.raises(lp.ReplyValidationError, match="cut at max_tokens"):
        llama.create_chat_completion(PERSON_ASK, response_format=Person, max_tokens=4)


def joined_calls(deltas) -> list[tuple[str, str]]:
    calls: dict[int, list[str]] = {}
    for d in deltas:
        calls.setdefault(d.index, ["", ""])
        calls[d.index][0] += d.function.name or ""
        calls[d.index][1] += d.function.arguments or ""
    return [tuple(calls[i]) for i in sorted(calls)]


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}


def test_a_python_function_is_called_and_its_streamed_call_joins_to_the_whole_one(llama):
    # A function and a dict in one list; every parameter required, so no near-tie between ending the
    # object and adding an optional field can make the two greedy runs part.
    kwargs = {"tools": [get_time, WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}},
              "max_tokens": 40, "chat_template": HERMES_TEMPLATE}
    whole = llama.create_chat_completion(few_shot("hermes"), **kwargs)
    (call,) = whole.choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, lp.function_tool(get_time)["function"]["parameters"])
    assert call.function.name == "get_time" and get_time(**args).startswith("noon")
    chunks = list(llama.create_chat_completion(few_shot("hermes"), stream=True, **kwargs))
    assert joined_calls(d for c in chunks for d in c.choices[0].delta.tool_calls or []) == [
        (call.function.name, call.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("template,call_format", [("Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"),
                                                  ("Qwen3-Coder.jinja", "qwen3-coder")])
def test_the_server_streams_tool_call_deltas(smollm2_path, template, call_format):
    """A Hermes-style template and Qwen3-Coder's XML one: the openai client's own accumulator
    (chat.completions.stream) joins the streamed deltas into the call the whole reply has."""
    with llamaplug_server(smollm2_path, "--parallel", "1", "-c", "2048", "--chat-template-file",
                          str(TEMPLATES / template)) as (port, _):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        kwargs = {"model": smollm2_path.name, "messages": few_shot(call_format), "tools": [lp.function_tool(get_time)],
                  "tool_choice": "required", "max_tokens": 96, "temperature": 0}
        whole = client.chat.completions.create(**kwargs)
        stream = list(client.chat.completions.create(stream=True, **kwargs))
        with client.chat.completions.stream(**kwargs) as events:
            accumulated = events.get_final_completion()
    want = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []]
    assert want and whole.choices[0].finish_reason == "tool_calls"
    deltas = [d for c in stream if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert len(deltas) > 1  # the name first, then the arguments in pieces
    assert joined_calls(deltas) == want
    assert [(c.function.name, c.function.arguments) for c in accumulated.choices[0].message.tool_calls] == want
    assert stream[-1].choices[0].finish_reason == "tool_calls"
