"""Embeddings: many texts per llama_decode, pooled by llama.cpp (mean, cls, last) or per token (none).

The texts go into one embedding context as separate sequences, packed until a batch holds
n_batch tokens or n_seq_max sequences, as llama.cpp's llama-embedding packs them; the context
is kept for the next call, one per pooling type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..blocks.batch import LlamaBatch
from ..blocks.context import LlamaContext
from ..errors import ContextOverflowError, InvalidParameterError
from ..params import PoolingType
from ..raw import lib

if TYPE_CHECKING:
    from .llama import Llama

N_SEQ_MAX = 64
EMBED_CTX = 2048


def pooling_of(value: Any) -> PoolingType:
    if value is None:
        return PoolingType.UNSPECIFIED
    try:
        return PoolingType[value.upper()] if isinstance(value, str) else PoolingType(value)
    except (KeyError, ValueError):
        names = ", ".join(p.name.lower() for p in PoolingType if p != PoolingType.UNSPECIFIED)
        raise InvalidParameterError(f"pooling must be one of {names}, got {value!r}", field="pooling") from None


def context_for(llama: Llama, pooling: PoolingType) -> LlamaContext:
    """The embedding context for `pooling` (UNSPECIFIED: the model's own), made on first use."""
    cache: dict[PoolingType, LlamaContext] = llama.__dict__.setdefault("_embed_contexts", {})
    ctx = cache.get(pooling)
    if ctx is None or ctx.closed:
        n_ctx = min(llama.model.n_ctx_train or EMBED_CTX, EMBED_CTX)
        # Non-causal models need a whole sequence in one ubatch: n_batch = n_ubatch = n_ctx.
        params = llama.params.context_params().replace(
            n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_seq_max=N_SEQ_MAX, kv_unified=True, embeddings=True,
            pooling_type=pooling)
        ctx = cache[pooling] = LlamaContext(llama.model, params)
    return ctx


def embed(llama: Llama, texts: Any, normalize: bool = True, pooling: Any = None,
          truncate: bool = False) -> np.ndarray | list[np.ndarray]:
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts:
        raise InvalidParameterError("texts must be a non-empty list of strings", field="texts")
    ctx = context_for(llama, pooling_of(pooling))
    kind = PoolingType(int(lib.llama_pooling_type(ctx._ptr)))
    if kind == PoolingType.RANK:
        raise InvalidParameterError("this model pools by rank (a reranker): use rerank, not embed", field="pooling")
    model, limit = llama.model, ctx.n_batch
    tokenized = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidParameterError(f"texts[{i}] must be a string, got {type(text).__name__}",
                                        field=f"texts[{i}]")
        tokens = model.tokenize(text, True, False)
        if not tokens:
            raise InvalidParameterError(f"texts[{i}] has no tokens", field=f"texts[{i}]")
        if len(tokens) > limit:
            if not truncate:
                raise ContextOverflowError(f"texts[{i}] has {len(tokens)} tokens, more than the {limit} an "
                                           "embedding takes; shorten it or pass truncate=True")
            tokens = tokens[:limit]
        tokenized.append(tokens)
    n_embd = int(lib.llama_model_n_embd_out(model._ptr))
    pooled: list[np.ndarray | None] = [None] * len(texts)
    batch = LlamaBatch(limit, 1)
    group: list[int] = []

    def flush() -> None:
        ctx.clear_cache()
        (ctx.encode if _encoder_only(model) else ctx.decode)(batch)
        row = 0
        for seq, index in enumerate(group):
            n = len(tokenized[index])
            if kind == PoolingType.NONE:
                pooled[index] = np.stack([ctx.get_embeddings_ith(row + k) for k in range(n)])
            else:
                pooled[index] = ctx.get_embeddings_seq(seq)[:n_embd].copy()
            row += n
        batch.clear()
        group.clear()

    for index, tokens in enumerate(tokenized):
        if group and (batch.n_tokens + len(tokens) > limit or len(group) >= N_SEQ_MAX):
            flush()
        batch.add_sequence(tokens, seq_id=len(group), logits_all=True)
        group.append(index)
    flush()
    out = [p for p in pooled if p is not None]
    if normalize:
        out = [v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12) for v in out]
    return out if kind == PoolingType.NONE else np.stack(out).astype(np.float32)


def _encoder_only(model: Any) -> bool:
    return bool(lib.llama_model_has_encoder(model._ptr)) and not bool(lib.llama_model_has_decoder(model._ptr))
