"""The checks a chat's messages and tools go through before anything is rendered."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from .. import plugins
from ..blocks.cancellation import checkpoint
from ..errors import InvalidParameterError
from .tool_schema import as_tools

ROLES = ("system", "developer", "user", "assistant", "tool")


def _media_needs() -> str:
    found = plugins.providers("llamaplug_open_projector")
    if not found:
        return "the multimodal plugin (pip install llamaplug-mtmd) and LlamaParams(mmproj_path=...)"
    return f"a projector: LlamaParams(mmproj_path=...) ({', '.join(found)} is installed)"


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as plain dicts, each checked: a role we know, text content (a string or text parts).

    Content is passed on as given (text parts stay parts), so llama.cpp's chat layer renders it as
    llama-server does; an assistant message may carry tool_calls instead of content."""
    if not isinstance(messages, list) or not messages:
        raise InvalidParameterError("messages must be a non-empty list", field="messages")
    out = []
    for i, m in enumerate(messages):
        if not i % 1024:
            checkpoint()  # a request whose client left stops here (a server's worker thread)
        if isinstance(m, BaseModel):
            m = m.model_dump(exclude_none=True)
        if not isinstance(m, dict):
            raise InvalidParameterError(f"messages[{i}] must be a dict with role and content", field=f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise InvalidParameterError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                                        field=f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in ("image_url", "input_audio"):
                    raise InvalidParameterError(f"messages[{i}].content[{j}]: {kind} needs {_media_needs()}",
                                                field=f"messages[{i}].content[{j}]")
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise InvalidParameterError(f"messages[{i}].content[{j}] must be a text part",
                                                field=f"messages[{i}].content[{j}]")
        elif content is None and role == "assistant" and m.get("tool_calls"):
            pass
        elif not isinstance(content, str):
            raise InvalidParameterError(f"messages[{i}].content must be text", field=f"messages[{i}].content")
        out.append(m)
    return out


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
