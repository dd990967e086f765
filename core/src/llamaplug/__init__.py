"""llamaplug: GGUF language models on llama.cpp, with compute backends as plugins.

Layers: ``llamaplug.raw`` (cffi over llama.h), ``llamaplug.blocks`` (Backend,
Model, Context, Batch, Sampler), ``llamaplug.high`` (Llama, completions).
"""

from __future__ import annotations

import pluggy

from ._version import GGML_VERSION, LLAMA_CPP_COMMIT, __version__
from .errors import (
    BackendError,
    BackendMismatchError,
    BackendNotInitialisedError,
    ChatTemplateError,
    ClosedError,
    ContextOverflowError,
    ContextTooLargeError,
    DecodeError,
    DraftVocabMismatchError,
    HubError,
    InvalidGrammarError,
    InvalidModelError,
    InvalidParameterError,
    InvalidTokenError,
    LlamaError,
    LoadCancelledError,
    ModelNotFoundError,
    NoBackendError,
    QuantizeError,
    ReplyValidationError,
    SamplingError,
    StateError,
    TokenizerError,
    TokenizerMismatchError,
    UnsupportedVocabError,
)
from .params import (
    AttentionType,
    ContextParams,
    FlashAttnType,
    KvCacheType,
    LlamaParams,
    ModelParams,
    NumaStrategy,
    PoolingType,
    RopeScalingType,
    SamplerParams,
    SplitMode,
)

hookimpl = pluggy.HookimplMarker("llamaplug")

from .blocks.adapters import ControlVector, LoraAdapter  # noqa: E402
from .blocks.backend import BackendStatus, DeviceInfo, LlamaBackend  # noqa: E402
from .blocks.batch import LlamaBatch  # noqa: E402
from .blocks.builder import ContextBuilder  # noqa: E402
from .blocks.context import LlamaContext  # noqa: E402
from .blocks.grammar import Grammar  # noqa: E402
from .blocks.model import LlamaModel  # noqa: E402
from .blocks.quantize import QUANT_TYPES, quantize  # noqa: E402
from .blocks.sampling import LlamaSampler, SamplerChain  # noqa: E402
from .high.async_llama import AsyncLlama  # noqa: E402
from .high.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402
from .high.chat_template import ChatTemplate  # noqa: E402
from .high.completion import Completion, CompletionChunk, CompletionTimings, StopReason, TokenLogprob  # noqa: E402
from .high.llama import Llama  # noqa: E402
from .high.tool_schema import function_tool  # noqa: E402


def backends() -> list[BackendStatus]:
    """Every installed backend plugin with its probe verdict (initialises the backend)."""
    return LlamaBackend.init().backends()


__all__ = [
    "GGML_VERSION", "LLAMA_CPP_COMMIT", "__version__", "hookimpl", "backends",
    "LlamaBackend", "BackendStatus", "DeviceInfo", "LlamaModel", "LlamaContext", "ContextBuilder",
    "LoraAdapter", "ControlVector", "LlamaBatch",
    "quantize", "QUANT_TYPES",
    "LlamaSampler", "SamplerChain", "Grammar", "Llama", "AsyncLlama", "Completion", "CompletionChunk",
    "CompletionTimings",
    "StopReason", "TokenLogprob", "ChatCompletion", "ChatCompletionChunk", "ChatTemplate",
    "LlamaParams", "ModelParams", "ContextParams", "SamplerParams", "KvCacheType", "FlashAttnType",
    "NumaStrategy", "SplitMode", "RopeScalingType", "PoolingType", "AttentionType",
    "LlamaError", "BackendError", "BackendMismatchError", "BackendNotInitialisedError", "NoBackendError",
    "ModelNotFoundError", "InvalidModelError", "ContextTooLargeError", "ContextOverflowError", "DecodeError",
    "DraftVocabMismatchError",
    "InvalidParameterError", "InvalidTokenError", "ClosedError", "StateError", "SamplingError", "LoadCancelledError",
    "QuantizeError", "HubError",
    "InvalidGrammarError", "ChatTemplateError", "TokenizerError", "TokenizerMismatchError", "UnsupportedVocabError",
    "ReplyValidationError", "function_tool",
]
