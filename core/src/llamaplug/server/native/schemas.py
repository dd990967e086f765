"""llama-server's own request bodies (/completion, /infill, /tokenize, /rerank, /slots, ...), as its README has them.

Strict types: llama-server's JSON reader refuses a string where a number goes ("type
must be number"), so a wrong type is a 400 here too, never a silent coercion. Fields
llama-server has and we do not read are ignored, as llama-server ignores unknown ones.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...params import SamplerParams, StructuredEngine
from ..openai.schemas import LogitBias

Prompt = str | list[int | str] | list[str | list[int | str]]


class JsonPrompt(BaseModel):
    """llama-server's prompt object: {"prompt_string": text or mixed ids, "multimodal_data": [base64, ...]}."""

    model_config = ConfigDict(extra="ignore", strict=True)

    prompt_string: str | list[int | str]
    multimodal_data: str | list[str] | None = None  # one base64 string or several, as llama-server reads it


# /completion's prompt: llama-server's forms, each of its prompts also as a JsonPrompt
CompletionPrompt = str | list[int | str] | JsonPrompt | list[str | list[int | str] | JsonPrompt]


class _Native(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None


class NativeCompletionRequest(_Native):
    """POST /completion (and /completions): llama-server's fields that llamaplug reads."""

    prompt: CompletionPrompt = Field(description="text, token ids, text and ids mixed, a {prompt_string} object, or "
                                     "a list of those (one result each)")
    n_predict: int | None = Field(None, ge=-1, description="tokens to generate; -1: until the end (default: -n)")
    max_completion_tokens: int | None = Field(None, ge=-1, le=0x7FFFFFFF, description="llama-server's other name "
                                              "of n_predict (n_predict wins over it)")
    max_tokens: int | None = Field(None, ge=-1, le=0x7FFFFFFF, description="llama-server's other name of n_predict "
                                   "(n_predict and max_completion_tokens win over it)")
    stop: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=100, description="<= 0: greedy")
    top_k: int | None = Field(None, ge=0, le=0x7FFFFFFF)
    top_p: float | None = Field(None, ge=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    typical_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, gt=0, le=100)
    repeat_last_n: int | None = Field(None, ge=-1, le=0x7FFFFFFF)
    presence_penalty: float | None = Field(None, ge=-100, le=100)
    frequency_penalty: float | None = Field(None, ge=-100, le=100)
    seed: int | None = Field(None, ge=0, le=0xFFFFFFFF)
    cache_prompt: bool = Field(True, description="accepted; a slot's cached prefix is always reused")
    id_slot: int = Field(-1, ge=-1, description="accepted as a hint; the engine places requests itself")
    return_tokens: bool = False
    n_probs: int | None = Field(None, ge=0, le=100, description="with each token, the N most likely ones "
                                "(completion_probabilities)")
    post_sampling_probs: bool = Field(False, description="completion_probabilities as probabilities (prob, "
                                      "top_probs) rather than log probabilities")
    logit_bias: LogitBias | None = Field(None, description='{"token id or text": bias} or [[token, bias], ...]; '
                                         "false bans the token")
    ignore_eos: bool = Field(False, description="every end-of-generation token biased to -inf (listed in "
                             "generation_settings.logit_bias): generation goes on to n_predict")
    grammar: str | None = Field(None, description="a GBNF grammar the output must match")
    json_schema: dict[str, Any] | None = Field(None, description="a JSON schema the output must match")
    structured_engine: StructuredEngine | None = Field(
        None, description="llamaplug's: what constrains the output to json_schema or grammar (default: the server's "
                          "--structured-engine)")
    timings_per_token: bool = Field(False, description="a stream's every piece carries `timings` (so far)")
    return_progress: bool = Field(False, description="a stream has a piece with prompt_progress (total, cache, "
                                  "processed, time_ms) when the prompt starts and after each batch of it, as "
                                  "llama-server's")

    def predict(self) -> int | None:
        """The tokens asked for, under llama-server's names in its order (its schema's n_predict field and that
        field's aliases): n_predict, else max_completion_tokens, else max_tokens; None: none given."""
        return next((n for n in (self.n_predict, self.max_completion_tokens, self.max_tokens) if n is not None), None)

    def sampling(self, seed: int, defaults: dict[str, Any] | None = None) -> SamplerParams:
        """The request's sampling: `defaults` (the server's --temp, ...), else llama-server's, where it says nothing;
        `seed` where it gives none."""
        given = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
                 "typical_p": self.typical_p, "penalty_repeat": self.repeat_penalty,
                 "penalty_last_n": self.repeat_last_n, "penalty_present": self.presence_penalty,
                 "penalty_freq": self.frequency_penalty, "seed": self.seed if self.seed is not None else seed}
        return SamplerParams(**{**(defaults or {}), **{k: v for k, v in given.items() if v is not None}})


class InfillExtra(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    text: str
    filename: str = "tmp"


class InfillRequest(NativeCompletionRequest):
    """POST /infill: the text between input_prefix and input_suffix (a FIM model's tokens)."""

    prompt: Prompt = ""  # type: ignore[assignment]  # optional here: text after the middle token
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillExtra] = Field(default_factory=list)


class TokenizeRequest(_Native):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Native):
    tokens: list[int] = Field(default_factory=list)


class ApplyTemplateRequest(_Native):
    """What /v1/chat/completions takes that shapes the prompt (llama-server renders the same fields here)."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None

    def chat_fields(self) -> dict[str, Any]:
        fields = {k: getattr(self, k) for k in ("tools", "tool_choice", "parallel_tool_calls", "response_format",
                                                "json_schema", "grammar", "reasoning_format", "reasoning_effort",
                                                "chat_template_kwargs", "add_generation_prompt",
                                                "continue_final_message")}
        # llama-server renders `tools: []` as no tools (a template's `if tools` is false for both)
        return {**fields, "tools": self.tools or None}


class RerankRequest(_Native):
    """POST /v1/rerank (Jina/Cohere shape); `texts` in place of `documents` is the TEI shape (a bare list back)."""

    query: str
    documents: list[str] | None = None
    texts: list[str] | None = None
    top_n: int | None = Field(None, ge=0)
    return_text: bool = False


class SlotFile(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    filename: str | None = Field(None, description="for save and restore: a file name in --slot-save-path")


class NativeEmbeddingRequest(_Native):
    """POST /embeddings (llama-server's own, not OpenAI's): `content` (or `input`), in /v1/embeddings' shapes
    (server/openai/embedding_inputs.py: texts, token ids, prompt objects, content parts, media)."""

    content: str | list[Any] | dict[str, Any] | None = None
    input: str | list[Any] | dict[str, Any] | None = None
