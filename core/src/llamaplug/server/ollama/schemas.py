"""Ollama's request bodies (ollama/ollama api/types.go), and how their `options` and `format` map onto ours.

Unknown fields are ignored, as Ollama's JSON reader ignores them. In `options`, an unknown
key is ignored too (Ollama logs it and goes on), a known one of the wrong type is a 400 naming
it (as Ollama's Options.FromMap), and the options that size a model at load time (num_ctx,
num_gpu, num_thread, num_batch, ...) are accepted and left to the server's own settings:
here a model's context and threads are the server's -c / -t (or models.toml's), not a request's.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...params import SamplerParams, StructuredEngine
from ..errors import BadRequestError

log = logging.getLogger("llamaplug.server.ollama")

Duration = float | int | str  # keep_alive: seconds, or Go's "5m" (durations.py)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ToolCallFunction(_Body):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None


class ToolCall(_Body):
    id: str | None = None
    function: ToolCallFunction


class Message(_Body):
    role: str
    content: str | None = ""
    thinking: str | None = None
    images: list[str] | None = Field(None, description="base64 images (for a model served with a projector)")
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class _Generating(_Body):
    model: str = Field(min_length=1)
    stream: bool = Field(True, description="NDJSON lines as they come (Ollama's default), or one object")
    format: Literal["", "json"] | dict[str, Any] | None = Field(None, description='"json" or a JSON schema')
    options: dict[str, Any] | None = None
    keep_alive: Duration | None = None
    think: bool | Literal["low", "medium", "high", "max"] | None = None
    structured_engine: StructuredEngine | None = Field(
        None, description="llamaplug's, not Ollama's: what constrains the reply to `format` (default: the "
                          "server's --structured-engine)")


class ChatRequest(_Generating):
    messages: list[Message] = Field(default_factory=list, description="empty: load the model (keep_alive 0: unload)")
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = Field(None, description="llamaplug's, not Ollama's: as OpenAI's "
                                                     '("auto", "required", {"type": "function", ...})')


class GenerateRequest(_Generating):
    prompt: str | None = Field(None, description="empty: load the model (keep_alive 0: unload)")
    suffix: str | None = Field(None, description="the text after the insertion (fill-in-the-middle)")
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None


class EmbedRequest(_Body):
    model: str = Field(min_length=1)
    input: str | list[str]
    truncate: bool = True
    dimensions: int | None = Field(None, ge=1)
    options: dict[str, Any] | None = None
    keep_alive: Duration | None = None


class EmbeddingsRequest(_Body):
    model: str = Field(min_length=1)
    prompt: str
    options: dict[str, Any] | None = None
    keep_alive: Duration | None = None


class ModelName(_Body):
    """/api/show, /api/delete: `model` (or the older `name`)."""

    model: str | None = None
    name: str | None = None
    verbose: bool = False

    def which(self) -> str:
        given = self.model or self.name
        if not given:
            raise BadRequestError("model is required", param="model")
        return given


class PullRequest(ModelName):
    stream: bool = True
    insecure: bool = False


class CopyRequest(_Body):
    source: str = Field(min_length=1)
    destination: str = Field(min_length=1)


# Ollama's option -> (our SamplerParams field, the JSON types it takes).
_SAMPLING: dict[str, tuple[str, tuple[type, ...]]] = {
    "temperature": ("temperature", (int, float)),
    "top_k": ("top_k", (int,)),
    "top_p": ("top_p", (int, float)),
    "min_p": ("min_p", (int, float)),
    "typical_p": ("typical_p", (int, float)),
    "repeat_penalty": ("penalty_repeat", (int, float)),
    "repeat_last_n": ("penalty_last_n", (int,)),
    "presence_penalty": ("penalty_present", (int, float)),
    "frequency_penalty": ("penalty_freq", (int, float)),
    "mirostat": ("mirostat", (int,)),
    "mirostat_tau": ("mirostat_tau", (int, float)),
    "mirostat_eta": ("mirostat_eta", (int, float)),
}
# Options Ollama applies when it loads a model (or that have no counterpart here): accepted, not applied.
_LOAD_TIME = frozenset({"num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "use_mlock", "num_thread",
                        "num_keep", "numa", "low_vram", "vocab_only", "penalize_newline", "draft_num_predict"})


class Sampling:
    """A request's `options` as our sampling: SamplerParams, the token limit, the stop strings."""

    def __init__(self, options: dict[str, Any] | None, default_seed: int):
        given = dict(options or {})
        fields: dict[str, Any] = {}
        for key, value in given.items():
            if key in _SAMPLING:
                name, types = _SAMPLING[key]
                _check(key, value, types)
                fields[name] = value
            elif key not in ("seed", "num_predict", "stop") and key not in _LOAD_TIME:
                log.info("options.%s is not an option llamaplug knows: ignored (as Ollama ignores it)", key)
        seed = given.get("seed")
        if seed is not None:
            _check("seed", seed, (int,))
        # Ollama: a negative seed (its default -1) is a random one; ours is the server's --seed then.
        fields["seed"] = seed & 0xFFFFFFFF if seed is not None and seed >= 0 else default_seed
        limit = given.get("num_predict")
        if limit is not None:
            _check("num_predict", limit, (int,))
        # -1: until the end; -2: until the context is full (both: no limit of ours).
        self.max_tokens: int | None = limit if limit is not None and limit >= 0 else None
        stop = given.get("stop")
        if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
            if not isinstance(stop, str):
                raise BadRequestError("options.stop must be a list of strings", param="options.stop")
            stop = [stop]
        self.stop: list[str] | None = stop
        try:
            self.params = SamplerParams(**fields)
        except ValueError as exc:  # pydantic's: a value out of range
            first = exc.errors()[0] if hasattr(exc, "errors") else {}  # type: ignore[union-attr]
            ours = str(first.get("loc", ("",))[0])
            theirs = next((k for k, (n, _) in _SAMPLING.items() if n == ours), ours)
            raise BadRequestError(f"options.{theirs}: {first.get('msg', exc)}",
                                  param=f"options.{theirs}") from None


def _check(key: str, value: Any, types: tuple[type, ...]) -> None:
    if isinstance(value, bool) or not isinstance(value, types):
        kind = "an integer" if types == (int,) else "a number"
        raise BadRequestError(f"option {key!r} must be {kind}, not {value!r}", param=f"options.{key}")


def response_format(given: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """Ollama's `format` as an OpenAI response_format: "json" any JSON object, a dict that JSON schema."""
    if given is None or given == "":
        return None
    if given == "json":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "format", "schema": given}}
