"""The OpenAI request and response bodies the server reads and writes (pydantic, so the OpenAPI document lists them).

Unknown fields are ignored, as OpenAI's own server does for fields it does not
know; a field we know but cannot honour (n > 1, say) is a 400 naming it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...high.chat import ChatCompletion, Usage
from ...params import SamplerParams, StructuredEngine

MAX_CHOICES = 128

# What a client may send as logit_bias: {"token id or text": bias} (OpenAI's, llama-server's), or
# [[token id or text, bias], ...] (llama-server's); a bias of false bans the token.
LogitBias = dict[str, float | bool] | list[list[int | str | float | bool]]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = Field(False, description="a last chunk with the usage (and no choices) before [DONE]")


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=0, le=0xFFFFFFFF)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repeat_penalty: float | None = Field(None, ge=0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="one choice per prompt (llamaplug runs prompts, not copies, in parallel)")
    response_format: dict[str, Any] | None = None
    ignore_eos: bool = Field(False, description="llama-server's: every end-of-generation token biased to -inf")
    keep_alive: float | str | None = Field(None, description="how long the model stays loaded after this request "
                                           "(Ollama's: seconds or \"5m\"; 0 unloads it, negative keeps it)")
    verbose: bool = Field(False, description="llama-server's debug field: the reply carries `__verbose`, itself as "
                          "/completion writes it (prompt as rendered, generation_settings, timings, ...); in a "
                          "stream on the last chunk (chat) or on every chunk (completions)")

    def sampling(self, seed: int, defaults: dict[str, Any] | None = None) -> SamplerParams:
        """The request's sampling: `defaults` (the server's --temp, ...; SamplerParams fields), else llama-server's,
        where it says nothing; `seed` where it gives none."""
        given = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                 "seed": self.seed if self.seed is not None else seed,
                 "penalty_present": self.presence_penalty, "penalty_freq": self.frequency_penalty,
                 "penalty_repeat": self.repeat_penalty}
        return SamplerParams(**{**(defaults or {}), **{k: v for k, v in given.items() if v is not None}})

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: Literal[False] = False
    max_tokens: int | None = Field(16, ge=0)
    # llama-server's names of the same limit: its schema's n_predict field, whose aliases these are
    n_predict: int | None = Field(None, ge=-1, le=2**31 - 1, description="llama-server's: tokens to generate "
                                  "(wins over max_tokens; -1: the server's -n)")
    max_completion_tokens: int | None = Field(None, ge=0, le=2**31 - 1, description="wins over max_tokens, as in "
                                              "llama-server")

    def predict(self) -> int | None:
        """The tokens asked for, in llama-server's order: n_predict, max_completion_tokens, max_tokens (-1 given:
        None, the server's -n)."""
        asked = next(n for n in (self.n_predict, self.max_completion_tokens, self.max_tokens, -1) if n is not None)
        return None if asked < 0 else asked


class ChatRequest(_Request):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="choices, each its own request in the engine's batches "
                   "(llama-server caps n at its slots; here the ones past the free slots wait)")
    logprobs: bool | None = Field(None, description="each sampled token's log probability in choices[].logprobs")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="with logprobs: the most likely tokens at each "
                                     "step (default 20, as llama-server)")
    logit_bias: LogitBias | None = Field(None, description='{"token id or text": bias} or [[token, bias], ...] '
                                         "(llama-server's two shapes); false bans the token")
    grammar: str | None = Field(None, description="llama-server's: a GBNF grammar the reply must match")
    json_schema: dict[str, Any] | None = Field(None, description="llama-server's: a JSON schema the reply must "
                                               "match (response_format wins over it)")
    structured_engine: StructuredEngine | None = Field(
        None, description="llamaplug's: what constrains the reply to response_format, json_schema or grammar "
                          "(default: the server's --structured-engine)")
    timings_per_token: bool = Field(False, description="llama-server's: `timings` on every streamed chunk")
    return_progress: bool = Field(False, description="llama-server's: a stream's first chunk says how the prompt "
                                  "was read (prompt_progress: total, cache, processed, time_ms)")
    continue_final_message: bool | None = Field(None, description="continue the last (assistant) message; needs "
                                                "add_generation_prompt false, as llama-server")
    add_generation_prompt: bool = True
    # llama-server's chat-layer fields (common/chat.h): the template's reasoning and tool-call switches.
    parallel_tool_calls: bool | None = None
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] | None = Field(
        None, description="where the model's thinking goes: reasoning_content (auto, deepseek), inline (none)")
    reasoning_effort: str | None = Field(None, description='given to the template; "none" turns thinking off')
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="extra variables for the chat template "
                                                        "(e.g. enable_thinking)")
    reasoning_budget_tokens: int | None = Field(None, ge=-1, le=2**31 - 1, description="llama-server's: the thinking's "
                                                "length in tokens, then the message and the end-of-thinking tag are "
                                                "forced (0: no thinking; -1: the server's --reasoning-budget)")
    thinking_budget_tokens: int | None = Field(None, ge=-1, le=2**31 - 1, description="llama-server's other name for "
                                               "reasoning_budget_tokens (which wins when both are given)")
    reasoning_budget_message: str | None = Field(None, description="llama-server's: text forced before the "
                                                 "end-of-thinking tag when the budget is spent")

    def chat_fields(self) -> dict[str, Any]:
        """The chat layer's fields of this request (None: not given), for Served.chat_options."""
        given = self.model_fields_set
        return {"parallel_tool_calls": self.parallel_tool_calls, "reasoning_format": self.reasoning_format,
                "reasoning_effort": self.reasoning_effort, "chat_template_kwargs": self.chat_template_kwargs,
                "grammar": self.grammar, "json_schema": self.json_schema,
                "add_generation_prompt": self.add_generation_prompt if "add_generation_prompt" in given else None,
                "continue_final_message": self.continue_final_message,
                "reasoning_budget_tokens": self.reasoning_budget_tokens if self.reasoning_budget_tokens is not None
                else self.thinking_budget_tokens, "reasoning_budget_message": self.reasoning_budget_message}


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: str | list[Any] | dict[str, Any] = Field(
        description='text, token ids, {"prompt_string": text}, {"content": [text parts]}, or a list of those '
                    "(llama-server's shapes: server/openai/embedding_inputs.py)")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: None = None
    keep_alive: float | str | None = Field(None, description="how long the model stays loaded after this request "
                                           "(Ollama's: seconds or \"5m\"; 0 unloads it, negative keeps it)")


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class ModelStatus(BaseModel):
    value: Literal["loaded", "loading", "unloaded", "sleeping"]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "llamaplug"
    aliases: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list, description="llama-server's --tags (informational)")
    status: ModelStatus | None = Field(None, description="as llama-server's router: loaded, loading, unloaded or "
                                                         "sleeping (loads on the next request)")
    capabilities: list[str] = Field(default_factory=lambda: ["completion"],
                                    description='as llama-server\'s /models: "multimodal" too when the model has a '
                                                'projector (images, audio)')


class ModelAction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(description="a served model's id or alias")


class ModelActionResult(ModelCard):
    """POST /models/load and /models/unload: the model's card, and llama-server's {"success": true}."""

    success: bool = True


class ModelSummary(BaseModel):
    """One model in /v1/models' `models` list: llama-server's Ollama-shaped entry (its placeholders as it has
    them), which clients such as its web UI read the capabilities from."""

    name: str
    model: str
    modified_at: str = ""
    size: str = ""
    digest: str = ""
    type: str = "model"
    description: str = ""
    tags: list[str] = Field(default_factory=lambda: [""])
    capabilities: list[str]
    parameters: str = ""
    details: dict[str, Any] = Field(default_factory=lambda: {
        "parent_model": "", "format": "gguf", "family": "", "families": [""], "parameter_size": "",
        "quantization_level": ""})


class ModelList(BaseModel):
    models: list[ModelSummary] = Field(default_factory=list, description="llama-server's other listing, each model "
                                     "with its capabilities")
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    n_prompt_tokens: int | None = Field(None, description="exceed_context_size_error: the prompt's tokens")
    n_ctx: int | None = Field(None, description="exceed_context_size_error: what a slot holds")


class InputTokens(BaseModel):
    """llama-server's answer to /v1/responses/input_tokens and /v1/chat/completions/input_tokens."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int


class ChatReply(ChatCompletion):
    """A chat completion with llama-server's `timings` (prompt and generation speed)."""

    timings: dict[str, float] | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
