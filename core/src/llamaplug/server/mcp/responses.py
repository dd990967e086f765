"""MCP tools on /v1/responses: OpenAI's `{"type": "mcp", "server_label", "allowed_tools", "require_approval"}`
names a server of `serve --mcp-config`, whose tools the server runs in the chat route's bounded loop (loop.py).

The response has OpenAI's items: an `mcp_list_tools` item for each server asked (the tools offered), an `mcp_call`
item for each call run (`output`, or `error` with status "failed"), then the last round's output (a message, or
calls to the request's own functions), and the usage of every round. What OpenAI's API does and this server
cannot is a 400 naming the field: approvals (`require_approval` other than "never"), a remote `server_url`.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import Request

from ..api_error import BadRequestError
from ..openai.chat import chat as chat_route
from ..responses.schemas import (
    InputTokensDetails,
    McpCallOut,
    McpListedTool,
    McpListToolsOut,
    McpToolSpec,
    ResponseUsage,
)
from .loop import DEFAULT_BOUNDS, ChatLoop, offered_tools


def mcp_tool(spec: McpToolSpec) -> dict[str, Any]:
    """The chat request's tool (loop.py's shape) for a Responses request's MCP tool."""
    if spec.require_approval not in (None, "never"):
        raise BadRequestError('require_approval: this server asks no approvals; it runs the calls of the MCP '
                              'servers it was started with (give "never")', param="tools.require_approval")
    if spec.server_url is not None:
        raise BadRequestError("server_url: only the MCP servers of serve --mcp-config run here, by server_label",
                              param="tools.server_url")
    allowed = spec.allowed_tools
    if isinstance(allowed, dict):  # OpenAI's filter: only its tool_names is a list of names
        if set(allowed) != {"tool_names"}:
            raise BadRequestError("allowed_tools: a list of tool names, or {\"tool_names\": [...]}",
                                  param="tools.allowed_tools")
        allowed = allowed["tool_names"]
    return {"type": "mcp", "server_label": spec.server_label,
            **({"allowed_tools": allowed} if allowed is not None else {})}


async def mcp_response(body: Any, chat: Any, request: Request, served: Any, reply: Any) -> Any:
    """The response to `body` (a ResponsesRequest asking for MCP tools), `chat` its chat request, `reply` its
    routes._Reply (identity, items, keeping)."""
    if body.stream:
        raise BadRequestError("stream is not supported with MCP tools on /v1/responses (the chat route streams "
                              "them)", param="stream")
    configured = getattr(request.app.state, "mcp", None)
    if configured is None:
        raise BadRequestError('a tool of type "mcp" needs MCP servers: serve --mcp-config FILE', param="tools")
    functions, offered = offered_tools(chat.tools, configured)
    effort = body.reasoning.effort if body.reasoning is not None else None
    asked = chat.model_copy(update={"parallel_tool_calls": body.parallel_tool_calls, "reasoning_effort": effort,
                                    "structured_engine": getattr(body, "structured_engine", None)})
    max_steps, timeout = getattr(request.app.state, "mcp_bounds", DEFAULT_BOUNDS)
    loop = ChatLoop(asked, request, served, chat_route, configured, offered, functions, max_steps, timeout)
    items: list[Any] = []
    for tool in chat.tools:
        if isinstance(tool, dict) and tool.get("type") == "mcp":
            listed = configured.offered(tool["server_label"], tool.get("allowed_tools"))
            items.append(McpListToolsOut(id=f"mcpl_{uuid.uuid4().hex}", server_label=tool["server_label"], tools=[
                McpListedTool(name=t.tool, description=t.description, input_schema=t.parameters) for t in listed]))
    final = None
    async for kind, item in loop.rounds():
        if kind == "call":
            failed = item["is_error"]
            items.append(McpCallOut(id=f"mcp_{uuid.uuid4().hex}", server_label=item["server"], name=item["tool"],
                                    arguments=item["arguments"], output=None if failed else item["output"],
                                    error=item["output"] if failed else None,
                                    status="failed" if failed else "completed"))
        else:
            final = item
    answer, incomplete = reply.output(final.choices[0])
    items += answer
    prompt, generated = loop.usage
    usage = ResponseUsage(input_tokens=prompt, input_tokens_details=InputTokensDetails(), output_tokens=generated,
                          total_tokens=prompt + generated)
    return reply.finish(reply.response(items, incomplete).model_copy(update={"usage": usage}))
