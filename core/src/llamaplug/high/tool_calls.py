"""Tool calls: reading them out of a reply, and the grammar that makes a model write one.

The format follows the chat template's family, as llama.cpp's chat parser tells them apart:

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen 2.5/3, SmolLM3);
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``;
- ``llama3``: the reply is one JSON object ``{"name": ..., "parameters": {...}}``
  (optionally after ``<|python_tag|>``);
- ``json``: any other template: the reply is ``{"name": ..., "arguments": {...}}``.

`tool_choice="required"` or a named function puts a grammar of that format in front of
the sampler: the name is one of the tools' (or the named one), the arguments follow the
tool's JSON schema.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from pydantic import BaseModel

from ..errors import InvalidParameterError
from .chat_template import ChatTemplate
from .tool_schema import as_tools


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: str = "function"
    function: FunctionCall


def family(template: ChatTemplate) -> str:
    source = template.source or template.name or ""
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|python_tag|>" in source or "ipython" in source:
        return "llama3"
    return "json"


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """The tools as OpenAI's dicts, each checked; a Python function is made one (tool_schema.function_tool)."""
    if not isinstance(tools, list) or not tools:
        raise InvalidParameterError("tools must be a non-empty list", field="tools")
    tools = as_tools(tools)
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise InvalidParameterError(f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., '
                                        '"parameters": {...}}}}', field=f"tools[{i}]")
    return tools


def _call(name: Any, arguments: Any) -> ToolCall | None:
    if not isinstance(name, str):
        return None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}",
                    function=FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))


def _from_object(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return _call(obj.get("name"), args)


def parse(text: str, kind: str) -> tuple[str | None, list[ToolCall]]:
    """(the content left, the tool calls) of a reply; no calls found: (text, [])."""
    if kind == "hermes":
        calls = []
        for body in re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.S):
            try:
                call = _from_object(json.loads(body))
            except ValueError:
                call = None
            if call is None:
                return text, []  # a malformed call: the text stays the content, nothing is guessed
            calls.append(call)
        rest = re.sub(r"\s*<tool_call>.*?</tool_call>\s*", "", text, flags=re.S).strip()
        return (rest or None, calls) if calls else (text, [])
    if kind == "mistral":
        head, marker, body = text.partition("[TOOL_CALLS]")
        if not marker:
            return text, []
        try:
            items = json.loads(body.strip())
        except ValueError:
            return text, []
        items = items if isinstance(items, list) else [items]
        calls = [_from_object(item) for item in items]
        return (text, []) if not calls or None in calls else (head.strip() or None, calls)  # type: ignore[return-value]
    stripped = text.strip().removeprefix("<|python_tag|>").strip()
    if not stripped.startswith("{"):
        return text, []
    try:
        call = _from_object(json.loads(stripped))
    except ValueError:
        return text, []
    return (None, [call]) if call is not None else (text, [])


def grammar_for(tools: list[dict[str, Any]], tool_choice: Any, kind: str) -> str:
    """GBNF that lets the model write exactly one call of the chosen tool(s) in the family's format."""
    from ..blocks.json_schema import literal, schema_to_gbnf

    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [t for t in tools if t["function"]["name"] == name]
        if not chosen:
            raise InvalidParameterError(f"tool_choice names {name!r}, which is not among the tools",
                                        field="tool_choice")
    else:
        chosen = tools
    key = "parameters" if kind == "llama3" else "arguments"
    calls = [{"type": "object", "properties": {
        "name": {"const": t["function"]["name"]},
        key: t["function"].get("parameters") or {"type": "object"}}, "required": ["name", key]} for t in chosen]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    body = schema_to_gbnf(schema).replace("root ::=", "call ::=", 1)
    wrap = {"hermes": f'{literal("<tool_call>")} "\\n"? call "\\n"? {literal("</tool_call>")}',
            "mistral": f'{literal("[TOOL_CALLS]")} "[" call "]"'}.get(kind, "call")
    return f"root ::= {wrap}\n{body}"
