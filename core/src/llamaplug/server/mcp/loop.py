"""A chat request that asks for an MCP server's tools: the server runs the calls the model makes, in a bounded loop.

A request opts in with a tool of OpenAI's Responses shape, `{"type": "mcp", "server_label": NAME}` (optionally
`allowed_tools: [TOOL, ...]`), in its `tools`: that server's tools are offered as functions (`<server>_<tool>`,
as llama-server names them), beside the request's own. Each round is one /v1/chat/completions reply (the route's
own answer, openai/answer.py, so every field and check is the same); when the model calls only MCP tools, the
server runs them, adds the assistant's calls and their results to the messages and asks again. The request's
tool_choice holds in every round (nothing it asked is changed); after --mcp-max-steps rounds of calls, or
--mcp-timeout seconds, one last round has tool_choice "none", so the model answers with what it has. A call to
one of the request's own functions ends the loop: that reply goes back as it is, for the client to run its tool.

The reply is the last round's, with `mcp_calls` (each call run: `id`, `name`, `server`, `tool`, `arguments`,
`output`, `is_error`), the usage of every round summed, and `mcp_stopped` ("max_steps" or "timeout") when a bound
ended the calls. Streamed, each call is a chunk whose delta has `mcp_call` (sent when its result is in), a chunk
whose delta has `mcp_stopped` if a bound ended them, then the last round's reply as chunks. The loop itself is
high/mcp_loop.py's (`llamaplug chat --mcp-config` runs the same).
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

from ...high.mcp_loop import DEFAULT_BOUNDS, McpLoop
from ...high.mcp_tools import McpTool, McpTools
from ..api_error import ApiError, BadRequestError
from ..dialects import OPENAI

Answer = Callable[[Any, Request, Any], Awaitable[Any]]


def asks_for_mcp(tools: list[Any] | None) -> bool:
    return any(isinstance(t, dict) and t.get("type") == "mcp" for t in tools or [])


async def mcp_chat(body: Any, request: Request, served: Any, answer: Answer) -> Any:
    """Answer the chat request `body` (a ChatRequest asking for MCP tools) through `answer`, the chat route's."""
    configured: McpTools | None = getattr(request.app.state, "mcp", None)
    if configured is None:
        raise BadRequestError('a tool of type "mcp" needs MCP servers: serve --mcp-config FILE', param="tools")
    if body.n != 1:
        raise BadRequestError("n must be 1 with MCP tools", param="n")
    if body.verbose:
        raise BadRequestError("verbose is not supported with MCP tools", param="verbose")
    functions, offered = offered_tools(body.tools, configured)
    max_steps, timeout = getattr(request.app.state, "mcp_bounds", DEFAULT_BOUNDS)
    loop = ChatLoop(body, request, served, answer, configured, offered, functions, max_steps, timeout)
    if not body.stream:
        records: list[dict[str, Any]] = []
        reply = None
        async for kind, item in loop.rounds():
            if kind == "call":
                records.append(item)
            else:
                reply = item
        return JSONResponse({**jsonable_encoder(loop.summed(reply)), "mcp_calls": records, **loop.stopped})
    first = await loop.first()  # a bad request is a 4xx before the stream starts
    return StreamingResponse(loop.stream(first), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def offered_tools(given: list[Any], configured: McpTools) -> tuple[list[dict[str, Any]], dict[str, McpTool]]:
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


class ChatLoop:
    """high.mcp_loop's loop, each round asked of the chat route; the usage of every round summed."""

    def __init__(self, body: Any, request: Request, served: Any, answer: Answer, configured: McpTools,
                 offered: dict[str, McpTool], functions: list[dict[str, Any]], max_steps: int,
                 timeout: float) -> None:
        self.body, self.request, self.served, self.answer = body, request, served, answer
        self.functions = functions
        self.loop = McpLoop(configured, offered, body.messages, max_steps, timeout)
        self.usage = [0, 0]

    async def first(self) -> Any:
        return await self._ask(list(self.loop.messages), self.loop.last())

    async def _ask(self, messages: list[dict[str, Any]], last: bool) -> Any:
        update: dict[str, Any] = {"messages": messages, "tools": self.functions, "stream": False}
        if last:
            update["tool_choice"] = "none"
        reply = await self.answer(self.body.model_copy(update=update), self.request, self.served)
        if reply.usage is not None:
            self.usage[0] += reply.usage.prompt_tokens
            self.usage[1] += reply.usage.completion_tokens
        return reply

    def rounds(self, reply: Any = None) -> AsyncIterator[tuple[str, Any]]:
        return self.loop.rounds(self._ask, reply)

    @property
    def stopped(self) -> dict[str, Any]:
        """The reply's `mcp_stopped` when a bound ended the calls: which one."""
        return {} if self.loop.stopped is None else {"mcp_stopped": self.loop.stopped}

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
                if self.loop.stopped:
                    yield chunk({"mcp_stopped": self.loop.stopped})
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


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(jsonable_encoder(payload))}\n\n"
