"""Tool calls in OpenAI's shapes, and the checks a request's tools go through.

Which format a model writes its calls in, the grammar that makes it write one
(tool_choice "required" or a named function), and reading the calls out of a reply
are llama.cpp's chat layer's work (blocks/chat_layer.py, used by high/chat.py), as in
llama-server: every template the pin knows, not a list of families kept here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ..errors import InvalidParameterError
from .tool_schema import as_tools


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: str = "function"
    function: FunctionCall


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
