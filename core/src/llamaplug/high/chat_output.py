"""A chat reply in OpenAI's shapes: the ChatCompletion, its streamed ChatCompletionChunks, and the tool calls
they carry.

Which format a model writes its calls in, the grammar that makes it write one (tool_choice "required" or a named
function), and reading the calls out of a reply are llama.cpp's chat layer's work (blocks/chat_layer.py, through
chat_plan.py and chat_reply.py), as in llama-server: every template the pin knows, not a list of families kept here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from .completion import StopReason

FinishReason = Literal["stop", "length", "tool_calls"]


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: str = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    role: str
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    # The reply as the pydantic model given as response_format (Python only: not in the JSON).
    parsed: Any = Field(None, exclude=True)


class Choice(BaseModel):
    index: int
    message: ChatMessage
    finish_reason: FinishReason
    logprobs: dict[str, Any] | None = None  # {"content": [...]}: the server's, when a request asks for them


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A piece of a streamed call (OpenAI's shape): id, type and name with its first piece, then arguments."""
    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunction | None = None


class Delta(BaseModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None  # stream_options {"include_usage": true}: the last chunk's, with no choices


def finish_reason(reason: StopReason | None, calls: bool = False) -> FinishReason:
    """OpenAI's finish_reason; a reply with calls that ended by itself is "tool_calls", one cut by a limit stays
    "length" (its last call may be cut too), as llama-server's."""
    if reason in (StopReason.EOS, StopReason.STOP_SEQUENCE, StopReason.CANCELLED):
        return "tool_calls" if calls else "stop"
    return "length"
