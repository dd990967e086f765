"""The bounded loop of MCP tool calls, apart from how the model is asked (the server's chat route, the terminal's
Llama): each round is one chat reply; when the model calls only offered MCP tools, they are run, the assistant's
calls and their results are added to the messages, and the model is asked again.

The bounds are serve's and chat's --mcp-max-steps (rounds of calls) and --mcp-timeout (seconds for the whole
loop, a running call included: one still running when the time is out is stopped, and its result says so). Once
a bound is reached, the next round is the last: the caller asks it with tool_choice "none", so the model answers
with what it has. A call to anything else (or a call cut short) ends the loop: that reply is the caller's.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .mcp_tools import McpResult, McpTool, McpTools

# --mcp-max-steps and --mcp-timeout (seconds) defaults, serve's and chat's
DEFAULT_BOUNDS = (8, 300.0)

# ask(messages, last): one round's reply (a ChatCompletion's shape); `last`: the round must not call (tool_choice
# "none")
Ask = Callable[[list[dict[str, Any]], bool], Awaitable[Any]]


class McpLoop:
    """One request's loop: `rounds()` yields ("call", record) for each call run, then ("reply", the last reply).

    `messages` grows by each round's calls and results; `stopped` is the bound that ended the calls
    ("max_steps", "timeout") or None.
    """

    def __init__(self, tools: McpTools, offered: dict[str, McpTool], messages: list[dict[str, Any]],
                 max_steps: int = DEFAULT_BOUNDS[0], timeout: float = DEFAULT_BOUNDS[1]) -> None:
        self.tools, self.offered = tools, offered
        self.messages = list(messages)
        self.max_steps, self.timeout = max_steps, timeout
        self.deadline = time.monotonic() + timeout
        self.steps = 0
        self.stopped: str | None = None

    def last(self) -> bool:
        """Whether the next round is the last one (tool_choice "none")."""
        if self.stopped is None and self.steps >= self.max_steps:
            self.stopped = "max_steps"
        if self.stopped is None and time.monotonic() >= self.deadline:
            self.stopped = "timeout"
        return self.stopped is not None

    async def rounds(self, ask: Ask, reply: Any = None) -> AsyncIterator[tuple[str, Any]]:
        """Run the loop, asking through `ask`; `reply`: the first round's, when the caller asked it already."""
        while True:
            reply = reply if reply is not None else await ask(list(self.messages), self.last())
            choice = reply.choices[0]
            calls = choice.message.tool_calls or []
            if not calls or choice.finish_reason != "tool_calls" or any(
                    c.function.name not in self.offered or not _json(c.function.arguments) for c in calls):
                yield "reply", reply
                return
            self.messages.append({"role": "assistant", "content": choice.message.content,
                                  "tool_calls": [c.model_dump() for c in calls]})
            for call in calls:
                tool = self.offered[call.function.name]
                result = await self._run(tool, call.function.arguments)
                self.messages.append({"role": "tool", "tool_call_id": call.id, "content": result.text})
                yield "call", {"id": call.id, "name": tool.name, "server": tool.server, "tool": tool.tool,
                               "arguments": call.function.arguments, "output": result.text,
                               "is_error": result.is_error}
            self.steps += 1
            reply = None

    async def _run(self, tool: McpTool, arguments: str) -> McpResult:
        left = self.deadline - time.monotonic()
        out = f"the MCP loop's time (--mcp-timeout {self.timeout:g} s) ran out"
        if left <= 0:
            self.stopped = "timeout"
            return McpResult(f"error: {tool.name} was not run: {out}", True)
        result = await self.tools.call(tool.name, arguments, limit=left)
        if result is self.tools.OUT_OF_TIME:
            self.stopped = "timeout"
            return McpResult(f"error: {tool.name} was stopped: {out}", True)
        return result


def _json(arguments: str) -> bool:
    """Whether a call's arguments are whole JSON (a call cut short ends the loop: the template cannot show it)."""
    try:
        json.loads(arguments or "{}")
    except ValueError:
        return False
    return True
