"""The OpenAI request and response bodies the server reads and writes (pydantic, so the OpenAPI document lists them).

Unknown fields are ignored, as OpenAI's own server does for fields it does not
know; a field we know but cannot honour (n > 1, say) is a 400 naming it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..high.chat import Usage
from ..params import SamplerParams


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
    keep_alive: float | str | None = Field(None, description="how long the model stays loaded after this request "
                                           "(Ollama's: seconds or \"5m\"; 0 unloads it, negative keeps it)")

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


class ChatRequest(_Request):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: Literal[False] | None = None


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: str | list[str] = Field(description="text, or a list of texts (token-id input is not taken)")
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
    status: ModelStatus | None = Field(None, description="as llama-server's router: loaded, loading, unloaded or "
                                                         "sleeping (loads on the next request)")
    capabilities: list[str] = Field(default_factory=lambda: ["completion"],
                                    description='as llama-server\'s /models: "multimodal" too when the model has a '
                                                'projector (images, audio)')


class ModelAction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(description="a served model's id or alias")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
