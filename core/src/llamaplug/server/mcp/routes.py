"""GET /tools: the built-in tools (serve --tools) and the MCP servers' tools (serve --mcp-config), in llama-server's
shape; 403 when neither is configured."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from ..api_error import ForbiddenError
from ..builtin_tools.definitions import listing
from ..dialects import NATIVE

router = NATIVE.router()


@router.get("/tools")
async def tools(request: Request) -> list[dict[str, Any]]:
    """Each tool as llama-server lists it: `tool` (`<server>_<tool>`), `type` "mcp", `definition` (the OpenAI
    function offered to the model)."""
    configured = getattr(request.app.state, "mcp", None)
    builtin = getattr(request.app.state, "builtin_tools", None)
    if configured is None and not builtin:  # llama-server's answer without --mcp-servers-config or --tools
        raise ForbiddenError("this feature is disabled: serve --tools NAMES or --mcp-config FILE", "feature_disabled")
    mcp = [] if configured is None else configured.tools.values()
    return listing(builtin or []) + [{"display_name": t.name, "tool": t.name, "type": "mcp",
                                      "permissions": {"write": False}, "uses_cwd": False,
                                      "definition": t.definition()} for t in mcp]
