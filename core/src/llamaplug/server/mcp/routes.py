"""GET /tools: the MCP servers' tools (serve --mcp-config), in llama-server's shape; 403 when none are configured."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from ..api_error import ForbiddenError
from ..dialects import NATIVE

router = NATIVE.router()


@router.get("/tools")
async def tools(request: Request) -> list[dict[str, Any]]:
    """Each tool as llama-server lists it: `tool` (`<server>_<tool>`), `type` "mcp", `definition` (the OpenAI
    function offered to the model)."""
    configured = getattr(request.app.state, "mcp", None)
    if configured is None:  # llama-server's answer without --mcp-servers-config
        raise ForbiddenError("this feature is disabled: serve --mcp-config FILE", "feature_disabled")
    return [{"display_name": t.name, "tool": t.name, "type": "mcp", "permissions": {"write": False},
             "uses_cwd": False, "definition": t.definition()} for t in configured.tools.values()]
