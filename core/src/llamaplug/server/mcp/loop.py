"""A chat request that asks for an MCP server's tools: the server runs the calls the model makes, in a bounded loop.

A request opts in with a tool of OpenAI's Responses shape, `{"type": "mcp", "server_label": NAME}` (optionally
`allowed_tools: [TOOL, ...]`), in its `tools`: that server's tools are offered as functions (`<server>_<tool>`,
as llama-server names them), beside the request's own. Each round is one /v1/chat/completions reply (the route
itself, so every field and check is the same); when the model calls only MCP tools, the server runs them, adds
the assistant's calls and their results to the messages and asks again. The request's tool_choice holds in every
round (nothing it asked is changed); after --mcp-max-steps rounds of calls, or --mcp-timeout seconds, one last
round has tool_choice "none", so the model answers with what it has. A call to one of the request's own
functions ends the loop: that reply goes back as it is, for the client to run its tool.

The reply is the last round's, with `mcp_calls` (each call run: `id`, `name`, `server`, `tool`, `arguments`,
`output`, `is_error`) and the usage of every round summed. Streamed, each call is a chunk whose delta has
`mcp_call` (sent when its result is in), then the last round's reply as chunks.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, StreamingResponse

from ...high.mcp_tools import McpTool, McpTools
from ..api_error import ApiError, BadRequestError
from ..dialects import OPENAI

# serve's --mcp-max-steps and --mcp-timeout (seconds) defaults
DEFAULT_BOUNDS = (8, 300.0)

Answer = Callable[[Any, Request, Any], Awaitable[Any]]


def asks_for_mcp(tools: list[Any] | None) -> bool:
    return any(isinstance(t, dict) and t.get("type") == "mcp" for t in tools or [])


async def mcp_chat(body: Any, request: Request, served: Any, answer: Answer) -> Any:
    """Answer the chat request `body` (a ChatRequest asking for MCP tools) through `answer`, the chat route."""
    configured: McpTools | None = getattr(request.app.state, "mcp", None)
    if configured is None:
        raise BadRequestError('a tool of type "mcp" needs MCP servers: serve --mcp-config FILE', param="tools")
    if body.n != 1:
        raise BadRequestError("n must be 1 with MCP tools", param="n")
    if body.verbose:
        raise BadRequestError("verbose is not supported with MCP tools", param="verbose")
    functions, offered = _tools(body.tools, configured)
    max_steps, timeout = getattr(request.app.state, "mcp_bounds", DEFAULT_BOUNDS)
    loop = _Loop(body, request, served, answer, configured, offered, functions, max_steps, timeout)
    if not body.stream:
        records: list[dict[str, Any]] = []
        reply = None
        async for kind, item in loop.rounds():
            if kind == "call":
                records.append(item)
            else:
                reply = item
        return JSONResponse({**jsonable_encoder(loop.summed(reply)), "mcp_calls": records})
    first = await loop.first()  # a bad request is a 4xx before the stream starts
    return StreamingResponse(loop.stream(first), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _tools(given: list[Any], configured: McpTools) -> tuple[list[dict[str, Any]], dict[str, McpTool]]:
    functions: list[dict[str, Any]] = []
    offered: dict[str, McpTool] = {}
    for i, tool in enumerate(given):
        if not (isinstance(tool, dict) and tool.get("type") == "mcp"):
            functions.append(tool)
            continue
        label, allowed = tool.get("server_label"), tool.get("allowed_tools")
        if not isinstance(label, str) or label not in configured.servers:
            raise BadRequestError(f"tools[{i}].server_label must name a configured MCP server (one of "
                                  f"{sorted(configured.servers)})", param=f"tools[{i}].server_label")
        if allowed is not None and (not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed)):
            raise BadRequestError(f"tools[{i}].allowed_tools must be a list of tool names",
                                  param=f"tools[{i}].allowed_tools")
        for t in configured.offered(label, allowed):
            offered[t.name] = t
    if not offered:
        raise BadRequestError("the MCP servers asked for offer no tools", param="tools")
    return functions + [t.definition() for t in offered.values()], offered


class _Loop:
    def __init__(self, body: Any, request: Request, served: Any, answer: Answer, configured: McpTools,
                 offered: dict[str, McpTool], functions: list[dict[str, Any]], max_steps: int,
                 timeout: float) -> None:
        self.body, self.request, self.served, self.answer = body, request, served, answer
        self.configured, self.offered, self.functions = configured, offered, functions
        self.max_steps, self.deadline = max_steps, time.monotonic() + timeout
        self.messages = list(body.messages)
        self.steps = 0
        self.usage = [0, 0]

    async def first(self) -> Any:
        return await self._ask()

    async def _ask(self) -> Any:
        last = self.steps >= self.max_steps or time.monotonic() >= self.deadline
        update: dict[str, Any] = {"messages": list(self.messages), "tools": self.functions, "stream": False}
        if last:
            update["tool_choice"] = "none"
        reply = await self.answer(self.body.model_copy(update=update), self.request, self.served)
        if reply.usage is not None:
            self.usage[0] += reply.usage.prompt_tokens
            self.usage[1] += reply.usage.completion_tokens
        return reply

    async def rounds(self, reply: Any = None) -> AsyncIterator[tuple[str, Any]]:
        """("call", record) for each call run, then ("reply", the last round's reply)."""
        while True:
            reply = reply if reply is not None else await self._ask()
            message = reply.choices[0].message
            calls = message.tool_calls or []
            if not calls or any(c.function.name not in self.offered or not _json(c.function.arguments)
                                for c in calls) or reply.choices[0].finish_reason != "tool_calls":
                yield "reply", reply
                return
            self.messages.append({"role": "assistant", "content": message.content,
                                  "tool_calls": [c.model_dump() for c in calls]})
            for call in calls:
                tool = self.offered[call.function.name]
                result = await self.configured.call(tool.name, call.function.arguments)
                self.messages.append({"role": "tool", "tool_call_id": call.id, "content": result.text})
                yield "call", {"id": call.id, "name": tool.name, "server": tool.server, "tool": tool.tool,
                               "arguments": call.function.arguments, "output": result.text,
                               "is_error": result.is_error}
            self.steps += 1
            reply = None

    def summed(self, reply: Any) -> Any:
        usage = reply.usage.model_copy(update={"prompt_tokens": self.usage[0], "completion_tokens": self.usage[1],
                                               "total_tokens": sum(self.usage)})
        return reply.model_copy(update={"usage": usage})

    async def stream(self, first: Any) -> AsyncIterator[str]:
        ident, created, model = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), first.model

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
            choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
            return _event({"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": choices, **extra})

        yield chunk({"role": "assistant", "content": ""})
        try:
            async for kind, item in self.rounds(first):
                if kind == "call":
                    yield chunk({"mcp_call": item})
                    continue
                choice = item.choices[0]
                if choice.message.content:
                    yield chunk({"content": choice.message.content})
                if choice.message.tool_calls:
                    yield chunk({"tool_calls": [{"index": i, **c.model_dump()}
                                                for i, c in enumerate(choice.message.tool_calls)]})
                yield chunk({}, choice.finish_reason, timings=getattr(item, "timings", None))
                if self.body.include_usage:
                    usage = self.summed(item).usage.model_dump()
                    yield _event({"id": ident, "object": "chat.completion.chunk", "created": created,
                                  "model": model, "choices": [], "usage": usage})
        except ApiError as exc:  # the status line is sent: the error goes in the stream
            yield _event({"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.code}})
        except Exception as exc:
            from ...errors import LlamaError

            if not isinstance(exc, LlamaError):
                raise
            yield OPENAI.stream_error(exc)
        yield "data: [DONE]\n\n"


def _json(arguments: str) -> bool:
    """Whether a call's arguments are whole JSON (a call cut short ends the loop: the template cannot show it)."""
    try:
        json.loads(arguments or "{}")
    except ValueError:
        return False
    return True


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(jsonable_encoder(payload))}\n\n"
