"""llama-cpp-python's high-level API on llamaplug: `import llamaplug.compat.llama_cpp as llama_cpp`.

Or `llamaplug.compat.install_as_llama_cpp()` once, and `import llama_cpp` anywhere after it gives
this module. What is here: `Llama` (completions, chat, embeddings, tokens, state), `LlamaGrammar`,
`LogitsProcessorList`, `StoppingCriteriaList`, `LlamaState`, `LlamaTokenizer`, the constants callers pass to
`Llama(...)`, and of the ctypes layer only the two vocabulary functions outlines reads the vocabulary with
(`llama_model_get_vocab`, `llama_token_to_piece`). What is not: the rest of the ctypes layer
(`llama_cpp.llama_cpp`, `llama_cpp.llava_cpp`), the
private `_internals`, chat handlers and the server (docs/from-llama-cpp-python.md).
"""

from __future__ import annotations

from llamaplug import AttentionType, KvCacheType, PoolingType, RopeScalingType, SplitMode, __version__

from .grammar import LLAMA_GRAMMAR_DEFAULT_ROOT, LlamaGrammar
from .llama import Llama
from .processors import (
    LogitsProcessor,
    LogitsProcessorList,
    MinTokensLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
)
from .settings import LLAMA_DEFAULT_SEED
from .state import LlamaState
from .tokenizer import LlamaTokenizer, llama_model_get_vocab, llama_token_to_piece

# The llama-cpp-python release whose API this follows, marked as llamaplug's (a PEP 440 local version).
__version__ = f"0.3.36+llamaplug.{__version__.replace('-', '.')}"

LLAMA_SPLIT_MODE_NONE, LLAMA_SPLIT_MODE_LAYER, LLAMA_SPLIT_MODE_ROW = (int(m) for m in (
    SplitMode.NONE, SplitMode.LAYER, SplitMode.ROW))
LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED, LLAMA_ROPE_SCALING_TYPE_NONE, LLAMA_ROPE_SCALING_TYPE_LINEAR, \
    LLAMA_ROPE_SCALING_TYPE_YARN, LLAMA_ROPE_SCALING_TYPE_LONGROPE = (int(t) for t in RopeScalingType)
LLAMA_POOLING_TYPE_UNSPECIFIED, LLAMA_POOLING_TYPE_NONE, LLAMA_POOLING_TYPE_MEAN, LLAMA_POOLING_TYPE_CLS, \
    LLAMA_POOLING_TYPE_LAST, LLAMA_POOLING_TYPE_RANK = (int(t) for t in PoolingType)
LLAMA_ATTENTION_TYPE_UNSPECIFIED, LLAMA_ATTENTION_TYPE_CAUSAL, LLAMA_ATTENTION_TYPE_NON_CAUSAL = (
    int(t) for t in AttentionType)
GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, \
    GGML_TYPE_IQ4_NL, GGML_TYPE_BF16 = (int(t) for t in KvCacheType)

__all__ = [
    "Llama", "LlamaGrammar", "LlamaState", "LogitsProcessor", "LogitsProcessorList", "MinTokensLogitsProcessor",
    "StoppingCriteria", "StoppingCriteriaList", "LlamaTokenizer", "llama_model_get_vocab", "llama_token_to_piece",
    "LLAMA_DEFAULT_SEED", "LLAMA_GRAMMAR_DEFAULT_ROOT",
    "LLAMA_SPLIT_MODE_NONE", "LLAMA_SPLIT_MODE_LAYER", "LLAMA_SPLIT_MODE_ROW",
    "LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED", "LLAMA_ROPE_SCALING_TYPE_NONE", "LLAMA_ROPE_SCALING_TYPE_LINEAR",
    "LLAMA_ROPE_SCALING_TYPE_YARN", "LLAMA_ROPE_SCALING_TYPE_LONGROPE",
    "LLAMA_POOLING_TYPE_UNSPECIFIED", "LLAMA_POOLING_TYPE_NONE", "LLAMA_POOLING_TYPE_MEAN", "LLAMA_POOLING_TYPE_CLS",
    "LLAMA_POOLING_TYPE_LAST", "LLAMA_POOLING_TYPE_RANK",
    "LLAMA_ATTENTION_TYPE_UNSPECIFIED", "LLAMA_ATTENTION_TYPE_CAUSAL", "LLAMA_ATTENTION_TYPE_NON_CAUSAL",
    "GGML_TYPE_F32", "GGML_TYPE_F16", "GGML_TYPE_Q4_0", "GGML_TYPE_Q4_1", "GGML_TYPE_Q5_0", "GGML_TYPE_Q5_1",
    "GGML_TYPE_Q8_0", "GGML_TYPE_IQ4_NL", "GGML_TYPE_BF16",
]
