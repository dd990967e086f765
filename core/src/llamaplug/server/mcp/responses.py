"""MCP tools on /v1/responses: OpenAI's `{"type": "mcp", "server_label", "allowed_tools", "require_approval"}`
names a server of `serve --mcp-config`, whose tools the server runs in the chat route's bounded loop (loop.py).

The response has OpenAI's items: an `mcp_list_tools` item for each server asked (the tools offered), an `mcp_call`
item for each call run (`output`, or `error` with status "failed"), then the last round's output (a message, or
calls to the request's own functions), and the usage of every round. Streamed, with OpenAI's events: each item's
output_item.added and .done around its response.mcp_list_tools.* / response.mcp_call.* events (a call's once its
result is in), then the last round's items as the route streams a reply, then response.completed. What OpenAI's
API does and this server cannot is a 400 naming the field: approvals (`require_approval` other than "never"),
a remote `server_url`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

from fastapi import Request

from ..api_error import BadRequestError
from ..openai.answer import answer as chat_answer
from ..responses.schemas import (
    InputTokensDetails,
    McpCallOut,
    McpListedTool,
    McpListToolsOut,
    McpToolSpec,
    ResponseUsage,
)
from ..streaming import named_sse
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
    responses/translate.py's Reply (identity, items, keeping)."""
    configured = getattr(request.app.state, "mcp", None)
    if configured is None:
        raise BadRequestError('a tool of type "mcp" needs MCP servers: serve --mcp-config FILE', param="tools")
    functions, offered = offered_tools(chat.tools, configured)
    effort = body.reasoning.effort if body.reasoning is not None else None
    asked = chat.model_copy(update={"parallel_tool_calls": body.parallel_tool_calls, "reasoning_effort": effort,
                                    "structured_engine": getattr(body, "structured_engine", None)})
    max_steps, timeout = getattr(request.app.state, "mcp_bounds", DEFAULT_BOUNDS)
    loop = ChatLoop(asked, request, served, chat_answer, configured, offered, functions, max_steps, timeout)
    items: list[Any] = []
    for tool in chat.tools:
        if isinstance(tool, dict) and tool.get("type") == "mcp":
            listed = configured.offered(tool["server_label"], tool.get("allowed_tools"))
            items.append(McpListToolsOut(id=f"mcpl_{uuid.uuid4().hex}", server_label=tool["server_label"], tools=[
                McpListedTool(name=t.tool, description=t.description, input_schema=t.parameters) for t in listed]))
    if body.stream:
        first = await loop.first()  # a bad request is a 4xx before the stream starts
        return named_sse(_events(reply, loop, items, first), reply.error)
    final = None
    async for kind, item in loop.rounds():
        if kind == "call":
            items.append(_call(item))
        else:
            final = item
    answer, incomplete = reply.output(final.choices[0])
    return reply.finish(_finished(reply, loop, items + answer, incomplete))


def _call(item: dict[str, Any]) -> McpCallOut:
    failed = item["is_error"]
    return McpCallOut(id=f"mcp_{uuid.uuid4().hex}", server_label=item["server"], name=item["tool"],
                      arguments=item["arguments"], output=None if failed else item["output"],
                      error=item["output"] if failed else None, status="failed" if failed else "completed")


def _finished(reply: Any, loop: ChatLoop, items: list[Any], incomplete: bool) -> Any:
    prompt, generated = loop.usage
    usage = ResponseUsage(input_tokens=prompt, input_tokens_details=InputTokensDetails(), output_tokens=generated,
                          total_tokens=prompt + generated)
    return reply.response(items, incomplete).model_copy(update={"usage": usage})


async def _events(reply: Any, loop: ChatLoop, listed: list[McpListToolsOut], first: Any
                  ) -> AsyncIterator[tuple[str, str]]:
    """OpenAI's stream of an MCP response: each mcp_list_tools item, each mcp_call item once its result is in
    (in_progress, its arguments whole, completed or failed), then the last round's reply as the route streams
    a reply (its items one delta each), then response.completed (or incomplete)."""
    yield reply.event("response.created", response=reply.response(None))
    yield reply.event("response.in_progress", response=reply.response(None))
    items = reply.stream_items()

    def added(item: Any, done: Any, *kinds: tuple[str, dict[str, Any]]) -> Iterator[tuple[str, str]]:
        index = len(items.items)
        items.items.append(done)
        yield reply.event("response.output_item.added", output_index=index, item=item)
        for kind, fields in kinds:
            yield reply.event(kind, item_id=item.id, output_index=index, **fields)
        yield reply.event("response.output_item.done", output_index=index, item=done)

    for item in listed:
        for event in added(item.model_copy(update={"tools": []}), item, ("response.mcp_list_tools.in_progress", {}),
                           ("response.mcp_list_tools.completed", {})):
            yield event
    async for kind, item in loop.rounds(first):
        if kind == "call":
            done = _call(item)
            for event in added(done.model_copy(update={"output": None, "error": None, "status": "in_progress"}),
                               done, ("response.mcp_call.in_progress", {}),
                               ("response.mcp_call_arguments.delta", {"delta": done.arguments}),
                               ("response.mcp_call_arguments.done", {"arguments": done.arguments}),
                               (f"response.mcp_call.{done.status}", {})):
                yield event
            continue
        choice = item.choices[0]
        message = choice.message
        calls = [SimpleNamespace(id=c.id, index=i, function=c.function)
                 for i, c in enumerate(message.tool_calls or [])]
        delta = SimpleNamespace(reasoning_content=message.reasoning_content, content=message.content, tool_calls=calls)
        for event in items.feed(delta):
            yield event
        incomplete = choice.finish_reason == "length"
        for event in items.close("incomplete" if incomplete else "completed"):
            yield event
        final = reply.finish(_finished(reply, loop, items.items, incomplete))
        yield reply.event("response.incomplete" if incomplete else "response.completed", response=final)
