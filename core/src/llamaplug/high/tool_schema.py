"""Python functions as OpenAI tools: a callable's parameters as a JSON schema, from its signature and docstring.

    def get_weather(city: str, unit: Literal["C", "F"] = "C") -> str:
        '''The weather in a city.

        Args:
            city: The city's name.
            unit: Celsius or Fahrenheit.
        '''

    function_tool(get_weather) == {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city's name."},
            "unit": {"enum": ["C", "F"], "type": "string", "default": "C", "description": "Celsius or Fahrenheit."}},
            "required": ["city"]}}}

The type hints become JSON schema through pydantic (str, int, float, bool, list[...],
dict, Optional, Literal, Enum, pydantic models as $defs); a parameter with a default
is not required. The docstring's text before its first section is the description;
its Google ("Args:") or NumPy ("Parameters" underlined) section describes the parameters.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Sequence
from typing import Any

import pydantic

from ..errors import InvalidParameterError

# What `tools` takes: OpenAI's tool dicts, Python functions, or both mixed.
ToolSpec = dict[str, Any] | Callable[..., Any]

_GOOGLE_ARGS = {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments"}
_GOOGLE_HEADER = re.compile(r"^([A-Za-z][A-Za-z ]*):\s*$")
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")  # name (type): text
_NUMPY_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?::.*)?$")  # name : type
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function name


def as_tools(tools: Sequence[Any]) -> list[Any]:
    """`tools` with each callable made a tool (function_tool); a dict, or anything else, is left as given."""
    return [t if isinstance(t, dict) or not callable(t) else function_tool(t) for t in tools]


def function_tool(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI tool ({"type": "function", "function": {name, description, parameters}}) that calls `fn`."""
    name = getattr(fn, "__name__", type(fn).__name__)
    where = f"tools: {name}"
    if not _NAME.fullmatch(name):
        raise InvalidParameterError(f"{where}: a tool's name is letters, digits, _ and - (1 to 64): give the function "
                                    "a name (a lambda has none)", field="tools")
    try:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
    except (TypeError, ValueError, NameError) as exc:
        raise InvalidParameterError(f"{where}: cannot read its signature ({exc})", field="tools") from exc
    summary, described = parse_docstring(inspect.getdoc(fn))
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise InvalidParameterError(f"{where}: *{param.name} cannot be a tool's parameter (a call's arguments "
                                        "are one JSON object of named fields)", field="tools")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints.get(param.name, Any),
                              pydantic.Field(default, description=described.get(param.name)))
    try:
        model = pydantic.create_model(f"{name}_arguments", **fields)
        schema = model.model_json_schema()
    except (pydantic.PydanticUserError, pydantic.errors.PydanticSchemaGenerationError, TypeError, ValueError) as exc:
        raise InvalidParameterError(f"{where}: its parameters have no JSON schema ({exc})", field="tools") from exc
    defs = schema.pop("$defs", {})
    parameters = _untitled(_inlined(schema, defs, (), where))
    parameters.setdefault("properties", {})
    function: dict[str, Any] = {"name": name}
    if summary:
        function["description"] = summary
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(the description, {parameter: its description}) of a Google- or NumPy-style docstring."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    i = 0
    while i < len(lines) and not _section_at(lines, i):
        summary.append(lines[i].strip())
        i += 1
    while i < len(lines):
        header, numpy = _section_at(lines, i)
        i += 2 if numpy else 1
        body_start = i
        while i < len(lines) and not (lines[i] and not lines[i][0].isspace() and _section_at(lines, i)):
            i += 1
        if header.lower() in _GOOGLE_ARGS:
            params.update(_entries(lines[body_start:i], numpy))
    return " ".join(" ".join(summary).split()), params


def _section_at(lines: list[str], i: int) -> tuple[str, bool] | None:
    """(the section's name, whether NumPy-style) when a section starts at line i."""
    line = lines[i]
    if line[:1].isspace():
        return None
    if i + 1 < len(lines) and line.strip() and re.fullmatch(r"-{3,}", lines[i + 1].strip()):
        return line.strip(), True
    found = _GOOGLE_HEADER.match(line)
    return (found.group(1).strip(), False) if found else None


def _entries(body: list[str], numpy: bool) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    base = min((len(x) - len(x.lstrip()) for x in body if x.strip()), default=0)
    current = None
    for line in body:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        found = (_NUMPY_ENTRY if numpy else _GOOGLE_ENTRY).match(line.strip()) if indent == base else None
        if found:
            current = found.group(1)
            out[current] = [] if numpy else [found.group(2)]
        elif current is not None:
            out[current].append(line.strip())
    return {name: " ".join(" ".join(words).split()) for name, words in out.items()}


def _inlined(schema: Any, defs: dict[str, Any], seen: tuple[str, ...], where: str) -> Any:
    """`schema` with each "#/$defs/X" reference replaced by X itself.

    A tool's parameters must stand alone: the chat layer's tool-call grammar
    nests them inside a larger schema, where a reference to the root would point at nothing.
    """
    if isinstance(schema, list):
        return [_inlined(s, defs, seen, where) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
            name = value[len("#/$defs/"):]
            if name in seen:
                raise InvalidParameterError(f"{where}: {name} refers to itself; a tool's parameters cannot be "
                                            "recursive", field="tools")
            out.update(_inlined(defs[name], defs, (*seen, name), where))
        elif key in ("default", "const", "enum", "examples"):
            out[key] = value
        else:
            out[key] = _inlined(value, defs, seen, where)
    return out


def _untitled(schema: Any) -> Any:
    """`schema` without pydantic's "title" annotations (keys of properties and $defs are names, kept)."""
    if isinstance(schema, list):
        return [_untitled(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            out[key] = {name: _untitled(s) for name, s in value.items()}
        elif key in ("default", "const", "enum", "examples"):
            out[key] = value
        else:
            out[key] = _untitled(value)
    return out
