"""llamaplug: GGUF language models on llama.cpp, with compute backends as plugins.

Layers: ``llamaplug.raw`` (cffi over llama.h), ``llamaplug.blocks`` (Backend,
Model, Context, Batch, Sampler), ``llamaplug.high`` (Llama, completions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

from . import raw as _raw
from ._lazy import lazy_names
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
    EngineError,
    HubError,
    InvalidGrammarError,
    InvalidModelError,
    InvalidParameterError,
    InvalidTokenError,
    KvCacheFullError,
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

hookimpl = pluggy.HookimplMarker("llamaplug")


def _init_backends() -> object:
    from .blocks.backend import LlamaBackend

    return LlamaBackend.init()


# llamaplug.raw.llama_backend_init (seed 003's raw flow) loads the plugins' backends, blocks imported or not.
_raw.set_backend_loader(_init_backends)

# The rest is imported when first asked for (PEP 562): `import llamaplug.cli` or a plugin's `from llamaplug import
# hookimpl` then costs milliseconds, not the half second of pydantic, numpy and every layer, so `llamaplug serve`
# starts its backend probes and its model load that much sooner.
__getattr__, __dir__ = lazy_names(__name__, {
    ".params": ("AttentionType", "ContextParams", "FlashAttnType", "KvCacheType", "LlamaParams", "ModelParams",
                "NumaStrategy", "PoolingType", "RopeScalingType", "SamplerParams", "SplitMode"),
    ".blocks.adapters": ("ControlVector", "LoraAdapter"),
    ".blocks.backend": ("BackendStatus", "DeviceInfo", "LlamaBackend"),
    ".blocks.batch": ("LlamaBatch",),
    ".blocks.builder": ("ContextBuilder",),
    ".blocks.context": ("LlamaContext",),
    ".blocks.grammar": ("Grammar",),
    ".blocks.model": ("LlamaModel",),
    ".blocks.quantize": ("QUANT_TYPES", "quantize"),
    ".blocks.sampling": ("LlamaSampler", "SamplerChain"),
    ".high.async_llama": ("AsyncLlama",),
    ".high.chat": ("ChatCompletion", "ChatCompletionChunk", "ChatSpec"),
    ".high.chat_call": ("ChatCall", "ChatRun", "start_chat"),
    ".high.chat_template": ("ChatTemplate",),
    ".high.completion": ("Completion", "CompletionChunk", "CompletionTimings", "StopReason", "TokenLogprob"),
    ".high.llama": ("Llama",),
    ".high.tool_schema": ("function_tool",),
}, globals())

if TYPE_CHECKING:
    from .blocks.adapters import ControlVector, LoraAdapter
    from .blocks.backend import BackendStatus, DeviceInfo, LlamaBackend
    from .blocks.batch import LlamaBatch
    from .blocks.builder import ContextBuilder
    from .blocks.context import LlamaContext
    from .blocks.grammar import Grammar
    from .blocks.model import LlamaModel
    from .blocks.quantize import QUANT_TYPES, quantize
    from .blocks.sampling import LlamaSampler, SamplerChain
    from .high.async_llama import AsyncLlama
    from .high.chat import ChatCompletion, ChatCompletionChunk, ChatSpec
    from .high.chat_call import ChatCall, ChatRun, start_chat
    from .high.chat_template import ChatTemplate
    from .high.completion import Completion, CompletionChunk, CompletionTimings, StopReason, TokenLogprob
    from .high.llama import Llama
    from .high.tool_schema import function_tool
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


def backends() -> list[BackendStatus]:
    """Every installed backend plugin with its probe verdict (initialises the backend)."""
    from .blocks.backend import LlamaBackend

    return LlamaBackend.init().backends()


__all__ = [
    "GGML_VERSION", "LLAMA_CPP_COMMIT", "__version__", "hookimpl", "backends",
    "LlamaBackend", "BackendStatus", "DeviceInfo", "LlamaModel", "LlamaContext", "ContextBuilder",
    "LoraAdapter", "ControlVector", "LlamaBatch",
    "quantize", "QUANT_TYPES",
    "LlamaSampler", "SamplerChain", "Grammar", "Llama", "AsyncLlama", "Completion", "CompletionChunk",
    "CompletionTimings",
    "StopReason", "TokenLogprob", "ChatCompletion", "ChatCompletionChunk", "ChatTemplate",
    "ChatSpec", "ChatCall", "ChatRun", "start_chat",
    "LlamaParams", "ModelParams", "ContextParams", "SamplerParams", "KvCacheType", "FlashAttnType",
    "NumaStrategy", "SplitMode", "RopeScalingType", "PoolingType", "AttentionType",
    "LlamaError", "BackendError", "BackendMismatchError", "BackendNotInitialisedError", "NoBackendError",
    "ModelNotFoundError", "InvalidModelError", "ContextTooLargeError", "ContextOverflowError", "KvCacheFullError",
    "DecodeError",
    "DraftVocabMismatchError", "EngineError",
    "InvalidParameterError", "InvalidTokenError", "ClosedError", "StateError", "SamplingError", "LoadCancelledError",
    "QuantizeError", "HubError",
    "InvalidGrammarError", "ChatTemplateError", "TokenizerError", "TokenizerMismatchError", "UnsupportedVocabError",
    "ReplyValidationError", "function_tool",
]
