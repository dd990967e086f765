"""A finished reply read into a ChatCompletion: content, reasoning_content and tool calls, as the plan's parser
reads them (and a pydantic model as response_format parsed)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from .chat_output import ChatCompletion, ChatMessage, Choice, FinishReason, FunctionCall, ToolCall, Usage, finish_reason
from .chat_plan import ChatPlan
from .completion import Completion
from .structured import model_class, parse_reply


def as_chat(completion: Completion, model: str, plan: ChatPlan | None = None,
            response_format: Any = None) -> ChatCompletion:
    """The ChatCompletion of a finished reply; with a pydantic model as `response_format`, message.parsed is one."""
    if plan is None:
        content, reasoning, calls = completion.text, None, []
    else:
        msg = plan.read(completion.text)
        content = msg["content"] or None if msg["tool_calls"] else msg["content"]
        reasoning = msg["reasoning_content"] or None
        calls = [_tool_call(c) for c in msg["tool_calls"]]
        response_format = response_format if response_format is not None else plan.response_format
    n_prompt, n_out = completion.timings.prompt_tokens, len(completion.tokens)  # media positions included
    finish: FinishReason = finish_reason(completion.stop_reason, bool(calls))
    cls = model_class(response_format)
    parsed = parse_reply(cls, content, finish) if cls is not None and not calls else None
    message = ChatMessage(role="assistant", content=content, reasoning_content=reasoning, tool_calls=calls or None,
                          parsed=parsed)
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex[:24]}", created=int(time.time()), model=model,
        choices=[Choice(index=0, message=message, finish_reason=finish)],
        usage=Usage(prompt_tokens=n_prompt, completion_tokens=n_out, total_tokens=n_prompt + n_out))


def _tool_call(call: dict[str, Any]) -> ToolCall:
    return ToolCall(id=call["id"] or f"call_{uuid.uuid4().hex[:24]}",
                    function=FunctionCall(name=call["name"], arguments=call["arguments"]))
