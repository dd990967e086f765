"""Anthropic's Messages API bodies (POST /v1/messages): the request the server reads, the message it writes.

As Anthropic's own server: `model` and `max_tokens` are required, `temperature` is in
0..1, content is a string or a list of typed blocks. Unknown fields are ignored (a
newer client's options); a block type we do not know is a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...params import StructuredEngine


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Body):
    type: Literal["text"]
    text: str


class Base64Source(_Body):
    type: Literal["base64"]
    media_type: str
    data: str


class UrlSource(_Body):
    type: Literal["url"]
    url: str


class ImageBlock(_Body):
    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Field(discriminator="type")]


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] = ""
    is_error: bool | None = None


class ThinkingBlock(_Body):
    """An earlier turn's reasoning: rendered as the assistant message's reasoning_content (as llama-server)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Body):
    """Reasoning a client holds only encrypted: nothing to render."""

    type: Literal["redacted_thinking"]
    data: str = ""


ContentBlock = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
                         | RedactedThinkingBlock, Field(discriminator="type")]


class InputMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[ContentBlock], Field(min_length=1)]


class Tool(_Body):
    type: Literal["custom"] | None = None  # server tools (web search, ...) have other types: a 400
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoiceAuto(_Body):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(_Body):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(_Body):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(_Body):
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]


class JsonOutputFormat(_Body):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Body):
    format: JsonOutputFormat | None = None  # structured output; `effort` is ignored


class ThinkingConfig(_Body):
    """Extended thinking: on ("enabled") or off; an enabled one's budget_tokens (default 10000, as llama-server)
    is the reasoning budget."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)


class MessagesRequest(_Body):
    model: str
    messages: list[InputMessage] = Field(description="[] is answered as llama-server does: a reply to the chat "
                                         "template's own prompt (and `system`, if given)")
    max_tokens: int = Field(ge=1)
    system: str | list[TextBlock] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    structured_engine: StructuredEngine | None = Field(
        None, description="llamaplug's: what constrains the reply to output_config.format (default: the server's "
                          "--structured-engine)")
    thinking: ThinkingConfig | None = None

    def enable_thinking(self) -> bool | None:
        """Thinking on or off as the request asks (None: the server's default)."""
        return None if self.thinking is None else self.thinking.type == "enabled"

    def thinking_budget(self) -> int | None:
        """The thinking's budget in tokens, as llama-server reads it (None: not given)."""
        if self.thinking is None or self.thinking.type != "enabled":
            return None
        return 10000 if self.thinking.budget_tokens is None else self.thinking.budget_tokens


class ThinkingOut(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class CountTokensRequest(MessagesRequest):
    """POST /v1/messages/count_tokens: a Messages request without max_tokens."""

    # llama-server counts without a model too (the server's own; the pin's test_sleep.py sends none)
    model: str | None = None  # type: ignore[assignment]
    max_tokens: int | None = Field(None, ge=1)  # type: ignore[assignment]
    messages: list[InputMessage] = Field(default_factory=list)  # type: ignore[assignment]  # [] counts, as there


class TokenCount(BaseModel):
    input_tokens: int


class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessageUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0


class MessageResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[Annotated[ThinkingOut | TextOut | ToolUseOut, Field(discriminator="type")]]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorBody(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorDetail
