"""Embeddings: many texts per llama_decode, pooled by llama.cpp (mean, cls, last) or per token (none).

The texts go into one embedding context as separate sequences, packed until a batch holds
n_batch tokens or n_seq_max sequences, as llama.cpp's llama-embedding packs them; the context
is kept for the next call, one per pooling type.

A prompt with media (`media_prompt`: text and image/audio parts, through the model's projector, the
`llamaplug_open_projector` hook's) is evaluated alone, by the projector's own decodes, as llama-server's
/embeddings evaluates it: its text and media chunks in order into one sequence, each its own decode, the
pooled vector being what llama.cpp pools of the last decode (the text after the last media: the prompt's
end, which attends to the media before it; llama-server's send_embedding reads the same batch).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..blocks.batch import LlamaBatch
from ..blocks.cancellation import checkpoint
from ..blocks.context import LlamaContext
from ..blocks.model import LlamaModel
from ..errors import ContextOverflowError, InvalidParameterError
from ..params import PoolingType
from ..plugin_api import MediaPrompt

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
        n_ctx = min(llama.model.n_ctx_for(0) or EMBED_CTX, EMBED_CTX)  # the training context, at most EMBED_CTX
        # Non-causal models need a whole sequence in one ubatch: n_batch = n_ubatch = n_ctx.
        params = llama.params.context_params().replace(
            n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_seq_max=N_SEQ_MAX, kv_unified=True, embeddings=True,
            pooling_type=pooling, n_outputs_max=0)  # every token is an output here: llama.cpp's default (n_batch)
        ctx = cache[pooling] = LlamaContext(llama.model, params)
    return ctx


def default_pooling(llama: Llama) -> str | None:
    """The pooling of embed(pooling=None) and of the server's /v1/embeddings: the model's own (None) where its GGUF
    names one, else "mean" (a chat model's own is per token, which neither OpenAI's API nor most callers expect)."""
    meta = llama.model.metadata
    own = meta.get(f"{meta.get('general.architecture', '')}.pooling_type", "0")
    return None if own not in ("0", "-1") else "mean"  # 0 none, -1 unspecified


_PART = re.compile(r"messages\[0\]\.content\[(\d+)\]")


def media_prompt(llama: Llama, parts: Sequence[dict[str, Any]], where: Sequence[str]) -> MediaPrompt:
    """The prompt of `parts` (OpenAI's content parts: text, image_url, input_audio) for `embed`, made by the model's
    projector as the chat path makes a message's (its `chat_prompt`), the texts as they are (no template) and each
    media part where it stands. `where[j]` names part j in errors (a request's field: "input[0].content[1]"); a
    media part's failure is the projector's LlamaError (MediaDecodeError, ...) naming it.

    Text parts are taken as they are, each beside the next: two in a row would be joined with a newline by the
    projector's message step, so give one text between media (llama-server's embeddings join them with nothing)."""
    projector = llama.projector
    if projector is None:
        kinds = sorted({p.get("type") for p in parts if isinstance(p, dict) and p.get("type") != "text"})
        first = next((w for p, w in zip(parts, where) if isinstance(p, dict) and p.get("type") != "text"), "input")
        raise InvalidParameterError(f"{first}: {', '.join(map(str, kinds)) or 'media'} needs a multimodal projector "
                                    f"(LlamaParams.mmproj_path, serve --mmproj), which {llama.model.path.name} was "
                                    "loaded without", field=first)
    messages = [{"role": "user", "content": list(parts)}]
    try:
        prompt, _ = projector.chat_prompt(messages, lambda flat: (flat[0]["content"], None))
    except InvalidParameterError as exc:  # it names messages[0].content[j]: the caller's name for part j instead
        found = _PART.search(str(exc))
        if found is not None and int(found.group(1)) < len(where):
            exc.args = (_PART.sub(lambda m: where[int(m.group(1))], str(exc), count=1), *exc.args[1:])
            exc.field = where[int(found.group(1))]
        raise
    return prompt


def embed(llama: Llama, texts: Any, normalize: bool = True, pooling: Any = None,
          truncate: bool = False) -> np.ndarray | list[np.ndarray]:
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts:
        raise InvalidParameterError("texts must be a non-empty list of strings", field="texts")
    if pooling is None:
        pooling = default_pooling(llama)
    ctx = context_for(llama, pooling_of(pooling))
    kind = ctx.pooling_type
    if kind == PoolingType.RANK:
        raise InvalidParameterError("this model pools by rank (a reranker): use rerank, not embed", field="pooling")
    tokenized: list[list[int]] = []
    media: dict[int, MediaPrompt] = {}  # texts[i] with media, evaluated alone
    for i, text in enumerate(texts):
        checkpoint()  # a request whose client left stops here (a server's worker thread), as between decodes
        if isinstance(text, MediaPrompt):
            if kind == PoolingType.NONE:
                raise InvalidParameterError(f"texts[{i}] has media, and pooling none (a row per token) is not given "
                                            "for a prompt with media: pool it (mean, cls or last)", field="pooling")
            if text.n_pos > ctx.n_ctx:
                raise ContextOverflowError(f"texts[{i}] takes {text.n_pos} positions, more than the {ctx.n_ctx} the "
                                           "embedding context holds; use a smaller image or a shorter text")
            media[i] = text
            continue
        if isinstance(text, str):
            tokens = llama.model.tokenize(text, True, False)
        elif isinstance(text, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in text):
            tokens = [int(t) for t in llama.model.check_tokens(text)]  # token ids, as given (llama-server's input)
        else:
            raise InvalidParameterError(f"texts[{i}] must be a string, a list of token ids or a media prompt "
                                        f"(media_prompt), got {type(text).__name__}", field=f"texts[{i}]")
        tokenized.append(_fit(tokens, ctx.n_batch, f"texts[{i}]", truncate))
    pooled = iter(_run(llama, ctx, tokenized, kind, llama.model.n_embd_out) if tokenized else [])
    out = [_run_media(llama, ctx, media[i]) if i in media else next(pooled)
           for i in range(len(texts))]
    if normalize:
        out = [v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12) for v in out]
    return out if kind == PoolingType.NONE else np.stack(out).astype(np.float32)


def rerank(llama: Llama, query: str, documents: Any, truncate: bool = False) -> np.ndarray:
    """Relevance scores of `documents` for `query` from a rank-pooling model: its first output for each."""
    if not isinstance(query, str):
        raise InvalidParameterError("query must be a string", field="query")
    if isinstance(documents, str) or not isinstance(documents, (list, tuple)) or not documents:
        raise InvalidParameterError("documents must be a non-empty list of strings", field="documents")
    ctx = context_for(llama, PoolingType.UNSPECIFIED)
    kind = ctx.pooling_type
    if kind != PoolingType.RANK:
        raise InvalidParameterError(f"{llama.model.path.name} pools by {kind.name.lower()}, not by rank: it is not a "
                                    "reranker", field="model")
    tokenized = []
    for i, doc in enumerate(documents):
        if not isinstance(doc, str):
            raise InvalidParameterError(f"documents[{i}] must be a string", field=f"documents[{i}]")
        tokenized.append(_fit(rerank_tokens(llama.model, query, doc), ctx.n_batch, f"documents[{i}]", truncate))
    n_out = llama.model.n_cls_out
    # The first output is the relevance, as llama.cpp's server reads it (p("yes") for Qwen3-Reranker's two).
    return np.stack(_run(llama, ctx, tokenized, kind, n_out))[:, 0].astype(np.float32)


def rerank_tokens(model: LlamaModel, query: str, doc: str) -> list[int]:
    """The model's rerank prompt (its "rerank" template, else [BOS] query [EOS] [SEP] doc [EOS]), as llama.cpp."""
    template = model.named_chat_template("rerank")
    if template is not None:
        prompt = template.replace("{query}", query).replace("{document}", doc)
        return model.tokenize(prompt, False, True)
    eos = model.eos
    if eos is None:
        eos = model.sep
    add_eos, add_sep = model.add_eos, model.add_sep
    end = [eos] if add_eos else []
    tokens = [model.bos] if model.add_bos and model.bos is not None else []
    tokens += model.tokenize(query, False) + end
    tokens += [model.sep] if add_sep else []
    return tokens + model.tokenize(doc, False) + end


def _fit(tokens: list[int], limit: int, what: str, truncate: bool) -> list[int]:
    if not tokens:
        raise InvalidParameterError(f"{what} has no tokens", field=what)
    if len(tokens) > limit:
        if not truncate:
            raise ContextOverflowError(f"{what} is too large: {len(tokens)} tokens, more than the {limit} one "
                                       "sequence takes here; shorten it or pass truncate=True")
        tokens = tokens[:limit]
    return tokens


def _run(llama: Llama, ctx: LlamaContext, tokenized: list[list[int]], kind: PoolingType, n_out: int
         ) -> list[np.ndarray]:
    """Each token list as its own sequence, many per decode; pooled rows (or per-token rows for NONE)."""
    pooled: list[np.ndarray | None] = [None] * len(tokenized)
    batch = LlamaBatch(ctx.n_batch, 1)
    group: list[int] = []
    encoder_only = _encoder_only(llama.model)

    def flush() -> None:
        checkpoint()
        ctx.clear_cache()
        llama.engine.call(lambda: (ctx.encode if encoder_only else ctx.decode)(batch))  # (engine.py: one thread)
        row = 0
        for seq, index in enumerate(group):
            n = len(tokenized[index])
            if kind == PoolingType.NONE:
                pooled[index] = np.stack([ctx.get_embeddings_ith(row + k) for k in range(n)])
            else:
                pooled[index] = ctx.get_embeddings_seq(seq)[:n_out].copy()
            row += n
        batch.clear()
        group.clear()

    for index, tokens in enumerate(tokenized):
        if group and (batch.n_tokens + len(tokens) > ctx.n_batch or len(group) >= N_SEQ_MAX):
            flush()
        batch.add_sequence(tokens, seq_id=len(group), logits_all=True)
        group.append(index)
    flush()
    return [p for p in pooled if p is not None]


def _run_media(llama: Llama, ctx: LlamaContext, prompt: MediaPrompt) -> np.ndarray:
    """The pooled vector of a prompt with media: evaluated alone into sequence 0 (its chunks, each its own decode),
    then llama.cpp's pooling of the last decode's tokens (the text after the last media)."""
    checkpoint()
    ctx.clear_cache()
    llama.engine.call(lambda: prompt.eval(ctx, 0, 0, ctx.n_batch, True))
    return ctx.get_embeddings_seq(0)[:llama.model.n_embd_out].copy()


def _encoder_only(model: LlamaModel) -> bool:
    return model.has_encoder and not model.has_decoder
