"""OpenAI's Responses API bodies (POST /v1/responses): the request the server reads, the response it writes.

Input is a string or a list of items: messages (text and image parts), and the
function_call / function_call_output items of an earlier tool round. Unknown fields are
ignored; a tool or item type we do not serve is a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from ...params import StructuredEngine


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class InputText(_Body):
    type: Literal["input_text"]
    text: str


class OutputText(_Body):
    type: Literal["output_text"]  # an assistant's earlier reply, sent back as history
    text: str


class InputImage(_Body):
    type: Literal["input_image"]
    image_url: str
    detail: str | None = None


InputPart = Annotated[InputText | OutputText | InputImage, Field(discriminator="type")]


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputPart]


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputPart]


def _item_type(item: Any) -> str:
    given = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")
    return given if isinstance(given, str) else "message"  # a message's "type" may be left out


InputItem = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                      | Annotated[FunctionCallOutputItem, Tag("function_call_output")], Discriminator(_item_type)]


class FunctionTool(_Body):
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class McpToolSpec(_Body):
    """OpenAI's MCP tool: a server of `serve --mcp-config` (by its name), run by the server (server/mcp/)."""

    type: Literal["mcp"]
    server_label: str
    allowed_tools: list[str] | dict[str, Any] | None = None  # names, or OpenAI's filter {"tool_names": [...]}
    require_approval: str | dict[str, Any] | None = None
    server_url: str | None = None


class FunctionChoice(_Body):
    type: Literal["function"]
    name: str


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Body):
    format: TextFormat | None = None


class ReasoningConfig(_Body):
    effort: str | None = None  # given to the template as reasoning_effort ("none": thinking off)
    summary: str | None = None


class ConversationRef(_Body):
    id: str


class ResponsesRequest(_Body):
    model: str | None = None
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: list[Annotated[FunctionTool | McpToolSpec, Field(discriminator="type")]] | None = None
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    text: TextConfig | None = None
    structured_engine: StructuredEngine | None = Field(
        None, description="llamaplug's: what constrains the reply to text.format (default: the server's "
                          "--structured-engine)")
    previous_response_id: str | None = None
    conversation: str | ConversationRef | None = Field(
        None, description="a conversation (POST /v1/conversations) whose items come before the input, and to which "
                          "the input and output items are added")
    store: bool = Field(True, description="keep the response (GET /v1/responses/{id}, previous_response_id)")
    metadata: dict[str, str] | None = None
    reasoning: ReasoningConfig | None = None
    # llama-server's stream fields, as on its chat route
    timings_per_token: bool = Field(False, description="llama-server's: `timings` on the last event of each piece")
    return_progress: bool = Field(False, description="llama-server's: a response.in_progress event with "
                                  "prompt_progress (total, cache, processed, time_ms) once the prompt is read")


class OutputTextPart(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputTextPart]


class ReasoningTextPart(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningOut(BaseModel):
    """The model's thinking (llama-server's reasoning item: the text in `content`, no summary)."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[Any] = []
    content: list[ReasoningTextPart]
    encrypted_content: str = ""
    status: ItemStatus


class FunctionCallOut(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class McpListedTool(BaseModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None = None


class McpListToolsOut(BaseModel):
    """The tools an MCP server offered (OpenAI's mcp_list_tools item)."""

    id: str
    type: Literal["mcp_list_tools"] = "mcp_list_tools"
    server_label: str
    tools: list[McpListedTool]
    error: str | None = None


class McpCallOut(BaseModel):
    """A call the server ran on an MCP server (OpenAI's mcp_call item): its output, or its error."""

    id: str
    type: Literal["mcp_call"] = "mcp_call"
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    error: str | None = None
    status: Literal["completed", "failed"] = "completed"
    approval_request_id: str | None = None


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    model: str
    output: list[Annotated[ReasoningOut | OutputMessage | FunctionCallOut | McpListToolsOut | McpCallOut,
                           Field(discriminator="type")]]
    usage: ResponseUsage | None = None
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] = []
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] = {}
    text: dict[str, Any] = {"format": {"type": "text"}}


class InputItemList(BaseModel):
    """GET /v1/responses/{id}/input_items: the items a kept response answered, a page at a time."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


class ConversationRequest(_Body):
    """POST /v1/conversations: its first items (up to 20, as OpenAI's) and metadata."""

    items: Annotated[list[InputItem], Field(max_length=20)] | None = None
    metadata: dict[str, str] | None = None


class ConversationUpdate(_Body):
    metadata: dict[str, str]


class ConversationItems(_Body):
    """POST /v1/conversations/{id}/items."""

    items: Annotated[list[InputItem], Field(min_length=1, max_length=20)]


class Conversation(BaseModel):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str] = {}


class DeletedConversation(BaseModel):
    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: bool = True
