"""`llamaplug chat --mcp-config FILE`: the MCP servers' tools in the terminal chat, run in serve's bounded loop.

Every configured tool is offered (as `<server>_<tool>`, llama-server's names); each round of a turn streams as a
plain reply does, and each call the model makes is run (high/mcp_loop.py, the loop serve runs) and shown as one
line, `[mcp] NAME ARGUMENTS -> OUTPUT`, before the model is asked again. --tool-choice holds in every round until
a bound (--mcp-max-steps, --mcp-timeout) is reached; the last round then has tool_choice "none".
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .chat_repl import ReasoningPrinter, stream_reply
from .high.chat_output import ChatCompletion, ChatMessage, Choice, FunctionCall, ToolCall, Usage
from .high.mcp_loop import McpLoop
from .high.mcp_tools import McpTools

SHOWN = 200  # characters of a call's output shown on its line


class McpChat:
    def __init__(self, tools: McpTools, tool_choice: str | dict[str, Any] | None, max_steps: int,
                 timeout: float) -> None:
        self.tools, self.tool_choice = tools, tool_choice
        self.max_steps, self.timeout = max_steps, timeout
        self.definitions = [t.definition() for t in tools.tools.values()]

    def reply(self, llama: Any, messages: list[dict[str, Any]], max_tokens: int | None, sampling: dict[str, Any],
              printer: ReasoningPrinter) -> tuple[str, list[dict[str, Any]]]:
        """The turn's last reply (its content) and the calls and results it added to `messages`."""
        loop = McpLoop(self.tools, self.tools.tools, messages, self.max_steps, self.timeout)
        wrote = [False]  # the round's text is on the terminal: a call's line starts after it

        async def ask(asked: list[dict[str, Any]], last: bool) -> Any:
            # generated here, on the main thread: Ctrl-C cancels it as in a plain turn
            ending: list[Any] = []
            choice = "none" if last else self.tool_choice
            # one call a round: after a call the grammar lets a small model write on to max_tokens, and a reply
            # cut there ends as "length" (its calls not run)
            content = stream_reply(llama, asked, max_tokens, {**sampling, "tools": self.definitions,
                                                              "tool_choice": choice, "parallel_tool_calls": False},
                                   printer, ending)
            wrote[0] = bool(content)
            return _reply(content, ending)

        async def turn() -> str:
            async for kind, item in loop.rounds(ask):
                if kind == "call":
                    if wrote[0]:
                        printer.finish()
                        wrote[0] = False
                    printer.out.write(f"[mcp] {item['name']} {_line(item['arguments'])} -> {_line(item['output'])}\n")
                    continue
                if loop.stopped == "timeout":
                    printer.out.write(f"[mcp] stopped: --mcp-timeout {self.timeout:g} s ran out\n")
                for call in item.choices[0].message.tool_calls or []:
                    printer.out.write(f"[mcp] {call.function.name} {call.function.arguments} not run: the reply "
                                      f"ended {item.choices[0].finish_reason!r}\n")
                return item.choices[0].message.content or ""
            return ""

        content = asyncio.run(turn())
        return content, loop.messages[len(messages):]


def _line(text: str) -> str:
    """`text` on one line (a JSON object compacted), cut at SHOWN characters."""
    try:
        text = json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        text = " ".join(text.split())
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


def _reply(content: str, ending: list[Any]) -> ChatCompletion:
    """A round's reply as the loop reads it (a ChatCompletion's choices), from its streamed calls and end."""
    calls: dict[int, dict[str, str]] = {}
    finish = "stop"
    for choice in ending:
        for part in choice.delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = part.id or call["id"]
            if part.function is not None:
                call["name"] += part.function.name or ""
                call["arguments"] += part.function.arguments or ""
        finish = choice.finish_reason or finish
    tool_calls = [ToolCall(id=c["id"], function=FunctionCall(name=c["name"], arguments=c["arguments"]))
                  for _, c in sorted(calls.items())]
    message = ChatMessage(role="assistant", content=content or None, tool_calls=tool_calls or None)
    return ChatCompletion(id="round", created=0, model="", usage=Usage(prompt_tokens=0, completion_tokens=0,
                                                                       total_tokens=0),
                          choices=[Choice(index=0, message=message, finish_reason=finish)])
