"""llama-cpp-python's constructor arguments and sampling arguments, as llamaplug's LlamaParams and SamplerChain.

`llama_params` maps `Llama(model_path, n_ctx=..., n_gpu_layers=..., ...)` (llama-cpp-python's names and
defaults) to a LlamaParams; `sampler_chain` builds the chain llama-cpp-python's `_init_sampler` builds for
`temperature`, `top_k`, ... with llamaplug's samplers, in its order.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any

from llamaplug import (
    AttentionType,
    FlashAttnType,
    Grammar,
    InvalidParameterError,
    KvCacheType,
    LlamaParams,
    PoolingType,
    RopeScalingType,
    SamplerChain,
    SplitMode,
)

log = logging.getLogger("llamaplug.compat")

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
UINT32 = 1 << 32

# llama-cpp-python's keyword arguments that have no counterpart here and change nothing that a caller could
# observe in results (performance counters, its own deques). Any other unknown keyword is ignored too, as
# llama-cpp-python ignores its **kwargs, but logged.
QUIET = frozenset({"no_perf", "last_n_tokens_size", "logits_all", "embedding", "lora_base", "f16_kv",
                   "offload_kqv_", "verbose"})
# What a caller may give that only llama-cpp-python's own modules can make: refused, not ignored.
FOREIGN = {
    "chat_handler": "a llama_cpp.llama_chat_format handler; use chat_format (a llama.cpp template name) or the "
                    "GGUF's own template",
    "draft_model": "a llama_cpp.llama_speculative draft model; pass speculative=\"ngram\" or "
                   "draft_model_path=... (LlamaParams) instead",
    "tokenizer": "a llama_cpp.llama_tokenizer object; pass tokenizer=\"hf:tokenizer.json\" (LlamaParams) for "
                 "llamaplug-tokenizer-hf",
    "kv_overrides": "GGUF metadata overrides are not supported by llamaplug",
}
REFUSED_FLAGS = {
    "vocab_only": "a Llama needs the weights (its context is made at load); for tokens alone use "
                  "llamaplug.LlamaModel(path, llamaplug.ModelParams(vocab_only=True))",
}


def llama_params(model_path: str | Path, options: dict[str, Any]) -> LlamaParams:
    """The LlamaParams for llama-cpp-python's `Llama(model_path, **options)`, with its defaults.

    A keyword that is a LlamaParams field (n_seq_max, backends, ...) passes through; one that
    is neither is ignored as llama-cpp-python ignores its **kwargs.
    """
    o = dict(options)
    for name, why in FOREIGN.items():
        if o.get(name) is not None:
            raise InvalidParameterError(f"{name} is not supported by llamaplug.compat.llama_cpp: {why}", field=name)
        o.pop(name, None)
    for name, why in REFUSED_FLAGS.items():
        if o.pop(name, False):
            raise InvalidParameterError(f"{name}=True is not supported by llamaplug.compat.llama_cpp: {why}",
                                        field=name)
    n_ctx = int_of(o.pop("n_ctx", 512), "n_ctx")
    # As llama-cpp-python: n_batch no larger than n_ctx, n_ubatch no larger than n_batch (n_ctx=0: the model's).
    n_batch = int_of(o.pop("n_batch", 512), "n_batch")
    n_batch = min(n_ctx, n_batch) if n_ctx else n_batch
    n_ubatch = min(n_batch, int_of(o.pop("n_ubatch", 512), "n_ubatch"))
    layers = int_of(o.pop("n_gpu_layers", 0), "n_gpu_layers")
    fields: dict[str, Any] = {
        "n_ctx": n_ctx, "n_batch": n_batch, "n_ubatch": n_ubatch,
        "n_gpu_layers": "all" if layers < 0 else layers,
        "split_mode": _enum(SplitMode, o.pop("split_mode", SplitMode.LAYER), "split_mode"),
        "main_gpu": o.pop("main_gpu", 0), "tensor_split": o.pop("tensor_split", None),
        "use_mlock": o.pop("use_mlock", False),
        "seed": seed_of(o.pop("seed", LLAMA_DEFAULT_SEED)),
        "rope_scaling_type": _enum(RopeScalingType, _or(o.pop("rope_scaling_type", -1), -1), "rope_scaling_type"),
        "pooling_type": _enum(PoolingType, o.pop("pooling_type", -1), "pooling_type"),
        "attention_type": _enum(AttentionType, o.pop("attention_type", -1), "attention_type"),
        "offload_kqv": o.pop("offload_kqv", True),
        "flash_attn_type": FlashAttnType.ENABLED if o.pop("flash_attn", False) else FlashAttnType.DISABLED,
        "log_level": "info" if o.get("verbose", True) else None,
        "progress": False,
    }
    lora_path, lora_scale = o.pop("lora_path", None), float(o.pop("lora_scale", 1.0))
    if lora_path is not None:
        fields["lora"] = [(Path(lora_path), lora_scale)]
        fields["use_mmap"] = False  # as llama-cpp-python: no mmap with a LoRA
    elif not o.pop("use_mmap", True):
        fields["use_mmap"] = False
    o.pop("use_mmap", None)
    # llama-cpp-python's thread defaults (not llamaplug's physical cores): half the logical CPUs for generation,
    # all of them for prompts; 0 or None is its default too
    fields["n_threads"] = o.pop("n_threads", None) or max((os.cpu_count() or 1) // 2, 1)
    fields["n_threads_batch"] = o.pop("n_threads_batch", None) or os.cpu_count() or 1
    for name in ("op_offload", "swa_full"):
        value = o.pop(name, None)
        if value is not None:
            fields[name] = value
    for name in ("type_k", "type_v"):
        value = o.pop(name, None)
        if value is not None:
            fields[name] = _enum(KvCacheType, value, name)
    # RoPE/YaRN: llama-cpp-python's defaults mean "the model's"; only other values are passed on.
    for name, default in (("rope_freq_base", 0.0), ("rope_freq_scale", 0.0), ("yarn_ext_factor", -1.0),
                          ("yarn_attn_factor", 1.0), ("yarn_beta_fast", 32.0), ("yarn_beta_slow", 1.0),
                          ("yarn_orig_ctx", 0)):
        value = o.pop(name, default)
        if value != default:
            fields[name] = value
    for name in list(o):
        if name in LlamaParams.model_fields:
            fields[name] = o.pop(name)
    ignored = sorted(set(o) - QUIET - {"numa", "chat_format", "spm_infill"})
    if ignored:
        log.debug("llama_cpp.Llama: ignoring %s (not used by llamaplug)", ", ".join(ignored))
    try:
        return LlamaParams(model_path=model_path, **fields)
    except ValueError as exc:
        if isinstance(exc, InvalidParameterError):
            raise
        raise InvalidParameterError(str(exc), field="Llama") from None


def seed_of(seed: Any) -> int:
    """A llama-cpp-python seed as llama.cpp's uint32 (-1, like any negative one, is LLAMA_DEFAULT_SEED: random)."""
    seed = int_of(seed, "seed")
    return LLAMA_DEFAULT_SEED if seed < 0 else seed % UINT32


def next_seed(seed: int) -> int:
    """The seed of the next completion that is given none: llama-cpp-python draws it from the previous one, so
    a Llama made with a seed (or restored with load_state) repeats its sequence of sampled texts."""
    return random.Random(seed).randint(0, UINT32) % UINT32


def sampler_chain(seed: int, *, temperature: float, top_k: int, top_p: float, min_p: float, typical_p: float,
                  repeat_penalty: float, frequency_penalty: float, presence_penalty: float, penalty_last_n: int,
                  mirostat_mode: int, mirostat_tau: float, mirostat_eta: float, grammar: Grammar | None = None,
                  logit_bias: dict[Any, float] | None = None, first: Any = None) -> SamplerChain:
    """llama-cpp-python's chain: [first (a Python stage)], logit bias, penalties, grammar, then greedy
    (temperature 0), dist (temperature < 0), mirostat, or top-k, typical, top-p, min-p, temperature, dist.

    Penalties that change nothing are left out, so that a grammar leads the chain (llamaplug samples a
    leading grammar the fast way; the tokens are the same).
    """
    chain = SamplerChain(seed=seed)
    if first is not None:
        chain.add(first)
    if logit_bias:
        chain.logit_bias(_biases(logit_bias))
    if penalty_last_n != 0 and (repeat_penalty != 1.0 or frequency_penalty != 0.0 or presence_penalty != 0.0):
        chain.penalties(penalty_last_n, float(repeat_penalty), float(frequency_penalty), float(presence_penalty))
    if grammar is not None:
        chain.grammar(grammar)
    if temperature < 0:
        return chain.dist()
    if temperature == 0:
        return chain.greedy()
    if mirostat_mode == 1:
        return chain.mirostat(float(mirostat_tau), float(mirostat_eta), 100)
    if mirostat_mode == 2:
        return chain.mirostat_v2(float(mirostat_tau), float(mirostat_eta))
    if mirostat_mode != 0:
        raise InvalidParameterError(f"mirostat_mode must be 0, 1 or 2, got {mirostat_mode!r}", field="mirostat_mode")
    return chain.top_k(int_of(top_k, "top_k")).typical(float(typical_p), 1).top_p(float(top_p), 1) \
        .min_p(float(min_p), 1).temp(float(temperature)).dist()


def _biases(logit_bias: dict[Any, float]) -> dict[int, float]:
    """OpenAI's logit_bias (keys may be strings, as JSON has them) as {token id: bias}."""
    try:
        return {int(k): float(v) for k, v in dict(logit_bias).items()}
    except (TypeError, ValueError):
        raise InvalidParameterError("logit_bias must map token ids to numbers", field="logit_bias") from None


def int_of(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if isinstance(value, float) and value.is_integer():
                return int(value)
            return int(value.__index__())
        except (AttributeError, TypeError):
            raise InvalidParameterError(f"{field} must be an int, got {value!r}", field=field) from None
    return value


def _enum(kind: Any, value: Any, field: str) -> Any:
    try:
        return kind(int_of(value, field))
    except ValueError:
        names = ", ".join(f"{m.value} ({m.name})" for m in kind)
        raise InvalidParameterError(f"{field} must be one of {names}, got {value!r}", field=field) from None


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value
