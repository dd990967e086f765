"""Parameters as pydantic models; their defaults are llama.cpp's own tools' defaults.

The defaults follow `common_params` of the pinned llama.cpp (what
`llama-completion` uses), not the bare `llama_context_default_params()`, so
the same model and prompt give the same greedy text as the native CLI.
Every model raises InvalidParameterError naming the field on bad input.
"""

from __future__ import annotations

import difflib
import enum
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import InvalidParameterError

# Limits of the pinned llama.cpp that its C code does not check (it crashes past them).
INT32_MAX = 0x7FFFFFFF  # uint32 fields that llama.cpp reads as int32
GGML_MAX_N_THREADS = 512  # ggml.h; llama_decode segfaults with more threads (n_threads=100000 does)
# llama_max_parallel_sequences(): the one bound on sequences (n_seq_max, LlamaBatch, the KV cells' bitset);
# a constant so that params need not load the library, and a test keeps it equal to the library's.
LLAMA_MAX_SEQ = 256


# what turns a JSON schema or grammar into a constraint (high/structured.py); every face's field takes these
StructuredEngine = Literal["gbnf", "llguidance", "auto"]

class NumaStrategy(enum.IntEnum):
    DISABLED = 0
    DISTRIBUTE = 1
    ISOLATE = 2
    NUMACTL = 3
    MIRROR = 4


class SplitMode(enum.IntEnum):
    NONE = 0
    LAYER = 1
    ROW = 2
    TENSOR = 3


class FlashAttnType(enum.IntEnum):
    AUTO = -1
    DISABLED = 0
    ENABLED = 1


class RopeScalingType(enum.IntEnum):
    UNSPECIFIED = -1
    NONE = 0
    LINEAR = 1
    YARN = 2
    LONGROPE = 3


class PoolingType(enum.IntEnum):
    UNSPECIFIED = -1
    NONE = 0
    MEAN = 1
    CLS = 2
    LAST = 3
    RANK = 4


class AttentionType(enum.IntEnum):
    UNSPECIFIED = -1
    CAUSAL = 0
    NON_CAUSAL = 1


class KvCacheType(enum.IntEnum):
    """KV-cache element type; the values are ggml_type ids."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    IQ4_NL = 20
    BF16 = 30

    @property
    def memory_factor(self) -> float:
        """Memory relative to F16 (seed 004's table)."""
        return {
            KvCacheType.F32: 2.0, KvCacheType.F16: 1.0, KvCacheType.BF16: 1.0,
            KvCacheType.Q8_0: 34 / 64, KvCacheType.Q5_0: 22 / 64, KvCacheType.Q5_1: 24 / 64,
            KvCacheType.Q4_0: 18 / 64, KvCacheType.Q4_1: 20 / 64, KvCacheType.IQ4_NL: 18 / 64,
        }[self]


def physical_cores() -> int:
    """Physical cores available, as llama.cpp's common_cpu_get_num_math() counts them on Linux."""
    try:
        available = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return max(1, (os.cpu_count() or 2) // 2)
    siblings = set()
    for cpu in available:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings")
        try:
            siblings.add(path.read_text().strip())
        except OSError:
            siblings.add(str(cpu))
    return max(1, len(siblings))


class Params(BaseModel):
    """Base: forbids unknown fields, validates on assignment, maps errors to ours."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)

    def __init__(self, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _as_invalid(exc, type(self)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise _as_invalid(exc, type(self)) from None

    def replace(self, **changes: Any):
        """A validated copy with `changes` applied."""
        return type(self)(**{**self.model_dump(), **changes})

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # Builder methods as in the seeds: params.with_n_ctx(2048) returns a new, validated copy.
        for name in cls.model_fields:
            if not hasattr(cls, f"with_{name}"):
                setattr(cls, f"with_{name}", _builder(name))


def _builder(name: str):
    def with_field(self, value):
        return self.replace(**{name: value})

    with_field.__name__ = f"with_{name}"
    with_field.__doc__ = f"A copy with `{name}` set (validated)."
    return with_field


def _as_invalid(exc: ValidationError, cls: type[BaseModel]) -> InvalidParameterError:
    first = exc.errors()[0]
    owner = cls.__name__
    field = ".".join(str(part) for part in first["loc"]) or None
    got = first.get("input")
    if first["type"] == "extra_forbidden" and field:
        return InvalidParameterError(f"{owner} has no field {field!r}{_did_you_mean(field, cls)}", field=field)
    message = f"{owner}.{field}: {first['msg']} (got {got!r})" if field else f"{owner}: {first['msg']}"
    return InvalidParameterError(message, field=field)


# llama-cpp-python's, llama.cpp's command line's and older llamaplug's names for fields (or for what takes their
# place), so that an unknown field's error says where the setting went.
RENAMED = {
    "flash_attn": "flash_attn_type (True, False, \"on\", \"off\" or \"auto\")",
    "verbose": "log_level (\"info\" shows llama.cpp's messages; progress=True the loading bar)",
    "chat_handler": "mmproj_path (a multimodal projector GGUF)",
    "clip_model_path": "mmproj_path",
    "model": "model_path",
    "embedding": "embeddings",
    "lora_path": "lora ([(path, scale)])",
    "lora_scale": "lora ([(path, scale)])",
    "draft_model": "draft_model_path (or speculative=\"ngram\")",
    "n_parallel": "n_seq_max", "parallel": "n_seq_max",
    "ctx_size": "n_ctx", "threads": "n_threads", "threads_batch": "n_threads_batch",
    "batch_size": "n_batch", "ubatch_size": "n_ubatch",
    "cache_type_k": "type_k", "cache_type_v": "type_v",
    "mlock": "use_mlock", "mmap": "use_mmap", "no_mmap": "use_mmap=False",
    "ngl": "n_gpu_layers", "gpu_layers": "n_gpu_layers",
    "pooling": "pooling_type", "rope_scaling": "rope_scaling_type",
    "no_kv_offload": "offload_kqv=False", "kv_offload": "offload_kqv",
    "temp": "temperature", "repeat_penalty": "penalty_repeat", "presence_penalty": "penalty_present",
    "frequency_penalty": "penalty_freq", "repeat_last_n": "penalty_last_n", "last_n_tokens_size": "penalty_last_n",
    "mirostat_mode": "mirostat",
}
# Settings that belong to the calls, not to loading.
_PER_CALL = {
    "chat_format": "the GGUF's own chat template is used; pass chat_template= to create_chat_completion for another",
    "logits_all": "pass logprobs= to create_completion",
    "n_predict": "pass max_tokens= to the completion calls", "max_tokens": "pass max_tokens= to the completion calls",
}


def _did_you_mean(name: str, cls: type[BaseModel]) -> str:
    fields = list(cls.model_fields)
    hint = RENAMED.get(name)
    target = hint.split(" ", 1)[0].split("=", 1)[0] if hint else name
    if target in fields:
        return f"; did you mean {hint!r}?" if hint == target else f"; did you mean {hint}?"
    if cls is not SamplerParams and name in _PER_CALL:
        return f": it is not a load setting; {_PER_CALL[name]}"
    if cls is not SamplerParams and target in SamplerParams.model_fields:
        return (f": it is a sampling setting, not a load one; pass {name}= to create_completion or "
                "create_chat_completion (or use a SamplerParams)")
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class ModelParams(Params):
    """How a model is loaded (llama_model_params)."""

    n_gpu_layers: int | Literal["auto", "all"] = Field(
        "auto", description='layers on GPUs: "auto" (llama.cpp\'s fitting to free device memory, as its CLI), '
                            '"all", or a count (-1 = all)')
    split_mode: SplitMode = Field(
        SplitMode.LAYER,
        description="how the model is split over several GPUs: NONE (all on main_gpu), LAYER (whole layers"
                    " per GPU), ROW (rows of each matrix), TENSOR")
    main_gpu: int = Field(0, ge=0, description="index of the GPU that holds the whole model when split_mode is NONE")
    tensor_split: list[float] | None = Field(
        None,
        description="share of the model (layers or rows) per GPU, in device order, e.g. [3, 1]; None = by free memory")
    devices: list[str] | None = Field(None, description="devices to offload to, by name (None = all GPUs; [] = none)")
    fit_target_mib: list[int] = Field(default_factory=lambda: [1024],
                                      description='"auto": memory to leave free per device (the last repeats)')
    fit_min_ctx: int = Field(4096, ge=0, description='"auto" with n_ctx=0: the smallest context it may choose')
    use_mmap: bool | None = Field(None, description="None = llama.cpp decides (mmap where supported)")
    use_mlock: bool = Field(False, description="lock the weights in RAM (mlock) so that the OS cannot swap them out")
    vocab_only: bool = Field(False, description="load only the vocabulary (tokenize and detokenize), no weights")
    check_tensors: bool = Field(
        False,
        description="validate the tensor data while loading (slower; finds corrupted files)")
    progress_callback: Callable[[float], bool | None] | None = Field(
        None, description="called with 0.0..1.0 while the weights load; returning False cancels the load")
    tokenizer: Any = Field(
        None, description='an external tokenizer for the model\'s text: "hf:/path/tokenizer.json" (or "hf:" + a '
                          'folder; plugin llamaplug-tokenizer-hf), or a tokenizer object a plugin takes; None = the '
                          'GGUF\'s')

    @field_validator("tokenizer", mode="before")
    @classmethod
    def _tokenizer(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.partition(":")[0]:
            raise ValueError('tokenizer must be "name:source" (e.g. "hf:/path/to/tokenizer.json") or an object')
        if isinstance(value, str) and ":" not in value:
            raise ValueError(f'tokenizer {value!r} names no plugin: write "hf:{value}" for a tokenizer.json')
        return value

    @field_validator("n_gpu_layers", mode="before")
    @classmethod
    def _layers(cls, value: Any) -> Any:
        # Checked before the union, so an error names the field, not one of the union's members.
        # A count may come as text (the CLI's -ngl 12).
        if isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        if value in ("auto", "all") or (isinstance(value, int) and not isinstance(value, bool) and value >= -1):
            return value
        raise ValueError(f'n_gpu_layers must be "auto", "all" or a layer count >= -1 (-1 = all), got {value!r}')

    # The one place that reads n_gpu_layers' words.
    @property
    def gpu_layers(self) -> int:
        """llama.cpp's n_gpu_layers: -1 for "all" and for "auto" (the fit lowers it), else the count."""
        return -1 if isinstance(self.n_gpu_layers, str) else self.n_gpu_layers

    @property
    def fit_layers(self) -> bool:
        """Whether llama.cpp's fitting decides the layers ("auto"; nothing to place for vocab_only)."""
        return self.n_gpu_layers == "auto" and not self.vocab_only

    @field_validator("fit_target_mib", mode="before")
    @classmethod
    def _targets(cls, value: Any) -> Any:
        value = [value] if isinstance(value, int) else value
        if isinstance(value, list) and (not value or any(isinstance(v, int) and v < 0 for v in value)):
            raise ValueError("fit_target_mib needs one or more sizes >= 0 (MiB)")
        return value

    @field_validator("tensor_split")
    @classmethod
    def _split_non_negative(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and any(v < 0 for v in value):
            raise ValueError("tensor_split proportions must be >= 0")
        return value

    @property
    def load_mode(self) -> int:
        """llama_load_mode for use_mmap/use_mlock."""
        if self.use_mmap is None:
            return 3 if self.use_mlock else -1  # MMAP_MLOCK / AUTO
        if self.use_mmap:
            return 3 if self.use_mlock else 1  # MMAP_MLOCK / MMAP
        return 2 if self.use_mlock else 0  # MLOCK / NONE


class ContextParams(Params):
    """How a context is created (llama_context_params; every field of seed 004)."""

    n_ctx: int = Field(0, ge=0, le=INT32_MAX, description="context window; 0 = the model's training context")
    n_batch: int = Field(
        2048, ge=1, le=INT32_MAX,
        description="logical batch: the most tokens one llama_decode takes (longer prompts are read in "
                    "batches of this size)")
    n_ubatch: int = Field(
        512, ge=1, le=INT32_MAX,
        description="physical batch: the most tokens computed at once inside a decode (<= n_batch); more ="
                    " faster prompts, more memory")
    n_seq_max: int = Field(
        1, ge=1, le=LLAMA_MAX_SEQ,
        description="the most sequences (parallel slots) the context holds; they share the n_ctx cells (at most 256)")
    n_outputs_max: int = Field(
        0, ge=0, le=INT32_MAX,
        description="the most rows of logits one batch asks for (its compute buffer is reserved for them); 0 = "
                    "n_batch. At least n_seq_max; `llamaplug serve` reserves one per slot and drafted token")
    n_threads: int = Field(
        default_factory=physical_cores, ge=1, le=GGML_MAX_N_THREADS,
        description="CPU threads for generation (one token per step); default = the physical cores")
    n_threads_batch: int | None = Field(None, ge=1, le=GGML_MAX_N_THREADS, description="None = n_threads")
    rope_scaling_type: RopeScalingType = Field(
        RopeScalingType.UNSPECIFIED,
        description="RoPE scaling: UNSPECIFIED = the model's, NONE, LINEAR, YARN, LONGROPE")
    pooling_type: PoolingType = Field(
        PoolingType.UNSPECIFIED,
        description="how embeddings are pooled per sequence: UNSPECIFIED = the model's, NONE (per token), "
                    "MEAN, CLS, LAST, RANK (rerank score)")
    attention_type: AttentionType = Field(
        AttentionType.UNSPECIFIED,
        description="attention for embeddings: UNSPECIFIED = the model's, CAUSAL, NON_CAUSAL")
    flash_attn_type: FlashAttnType = Field(
        FlashAttnType.AUTO,
        description="Flash Attention: AUTO (on where the backend supports it), DISABLED, ENABLED; also "
                    '"auto", "on", "off" or a bool')
    rope_freq_base: float = Field(0.0, description="RoPE base frequency; 0 = the model's")
    rope_freq_scale: float = Field(
        0.0,
        description="RoPE frequency scaling factor (1 / context extension); 0 = the model's")
    yarn_ext_factor: float = Field(
        -1.0,
        description="YaRN extrapolation mix factor; negative = the model's (1.0 with YARN scaling, else 0.0)")
    yarn_attn_factor: float = Field(-1.0, description="YaRN magnitude scaling factor; negative = the model's")
    yarn_beta_fast: float = Field(-1.0, description="YaRN low correction dimension; negative = the model's")
    yarn_beta_slow: float = Field(-1.0, description="YaRN high correction dimension; negative = the model's")
    yarn_orig_ctx: int = Field(
        0, ge=0, le=INT32_MAX,
        description="YaRN original context size in tokens; 0 = the model's training context")
    defrag_thold: float = Field(
        -1.0,
        description="deprecated in llama.cpp (it defragments by itself): defragment when holes / size > "
                    "this; <= 0 = off")
    embeddings: bool = Field(
        False,
        description="compute embeddings (with the logits): needed for Llama.embed and rerank")
    offload_kqv: bool = Field(
        True,
        description="keep the KV cache and the attention ops on the GPU with the offloaded layers")
    no_perf: bool = Field(False, description="skip llama.cpp's performance counters (llama_perf_context)")
    op_offload: bool = Field(
        True,
        description="run host tensors' operations (weights kept in RAM) on the GPU for large batches")
    swa_full: bool = Field(
        False,
        description="full-size KV cache for sliding-window layers (prompt reuse past the window; more memory)")
    kv_unified: bool = Field(
        False,
        description="one KV buffer for all sequences (best when they share a long prefix); False = one per sequence")
    type_k: KvCacheType = Field(
        KvCacheType.F16,
        description="element type of the K cache: F16, BF16, F32, Q8_0, Q5_1, Q5_0, Q4_1, Q4_0, IQ4_NL (or its name)")
    type_v: KvCacheType = Field(
        KvCacheType.F16,
        description="element type of the V cache, as type_k; a quantized V cache needs flash attention")

    def with_flash_attn(self, enabled: bool):
        """A copy with flash attention on or off (seed 002); flash_attn_type also takes "auto"."""
        return self.replace(flash_attn_type=FlashAttnType.ENABLED if enabled else FlashAttnType.DISABLED)

    @field_validator("flash_attn_type", mode="before")
    @classmethod
    def _flash_words(cls, value: Any) -> Any:
        words = {"auto": -1, "off": 0, "on": 1, False: 0, True: 1}
        return words.get(value.lower() if isinstance(value, str) else value, value)

    @field_validator("type_k", "type_v", mode="before")
    @classmethod
    def _kv_names(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return KvCacheType[value.upper()]
            except KeyError:
                raise ValueError(f"unknown KV cache type {value!r}; one of {[t.name for t in KvCacheType]}") from None
        return value


class LlamaParams(ModelParams, ContextParams):
    """Everything `Llama.load` needs: the model path, model and context parameters."""

    model_path: Path = Field(description='the GGUF model file')
    seed: int = Field(0xFFFFFFFF, ge=0, le=0xFFFFFFFF, description="default sampler seed")
    backends: list[str] | None = Field(None, description="backend plugins to use; None = chosen by probe")
    rpc_servers: list[str] = Field(default_factory=list, description='RPC servers ("host:port") whose devices to use')
    log_level: Literal["debug", "info", "warning", "error", "none"] | None = Field(
        None,
        description='llama.cpp\'s messages passed to the "llamaplug.native" logger; None = $LLAMAPLUG_LOG, '
                    'else "error"')
    lora: list[tuple[Path, float]] = Field(default_factory=list, description="LoRA adapters (path, scale) to apply")
    progress: bool | None = Field(None, description="a progress bar on stderr while loading (None: if a terminal)")
    mmproj_path: Path | None = Field(None, description="multimodal projector GGUF for image/audio chat parts "
                                                       "(plugin llamaplug-mtmd)")
    cache_ram_mib: int = Field(256, ge=0, le=1 << 30,
                               description="host memory (MiB) keeping the KV of sequences that left their slot, "
                                           "for later prompts with the same prefix (llama-server's --cache-ram); "
                                           "0 = off")
    cache_dir: Path | None = Field(None, description="a directory keeping the prompt cache on disk under the RAM "
                                                     "tier: long prompts' KV outlives the process (high/"
                                                     "disk_store.py); shared safely by processes; None = off")
    cache_disk_mib: int = Field(4096, ge=0, le=1 << 30,
                                description="the most MiB of cache files in cache_dir (least recently used go "
                                            "first); 0 = no disk tier")
    cache_exact: bool = Field(False, description="reuse a cached prefix (slot, RAM, disk) only up to a multiple of "
                                                 "n_ubatch, so that a greedy reply is the one a cold read gives, bit "
                                                 "for bit: on the CPU a prompt split elsewhere rounds otherwise. Up "
                                                 "to n_ubatch - 1 more tokens are read: pair it with a small n_ubatch")
    structured_engine: StructuredEngine = Field(
        "gbnf", description='what turns a JSON schema or grammar into a constraint (high/structured.py): "gbnf" '
                            "llama.cpp's converter and grammar sampler (as llama-server), \"llguidance\" the "
                            "llamaplug-llguidance plugin's sampler, \"auto\" llguidance when it is installed")
    # Speculative decoding (high/speculative.py): a draft model or n-gram lookup guesses tokens, the model checks
    # them in one batch; the output is the model's own.
    draft_model_path: Path | None = Field(None, description="a small model of the same vocabulary that drafts "
                                                             "tokens for speculative decoding")
    speculative: Literal["auto", "none", "ngram-mod", "ngram-simple", "ngram"] | None = Field(
        None, description='drafting with no second model: "auto" guesses what the reply copies from its prompt, '
                          "earlier turns or other requests (ngram-mod's lookup, adapted per request: "
                          "high/ngram_mod.py; what `llamaplug serve`, `run` and `chat` use), \"ngram-mod\" and "
                          "\"ngram-simple\" (or \"ngram\") as llama-server's --spec-type; None or \"none\": no "
                          "drafting (greedy output then is llama-completion's exactly)")
    draft_max: int = Field(16, ge=1, le=1024, description="the most tokens drafted per step")
    draft_min: int = Field(0, ge=0, le=1024, description="a draft model's drafts shorter than this are dropped")
    draft_p_min: float = Field(0.0, ge=0.0, le=1.0, description="a draft model stops drafting at a token whose "
                                                                "probability (among its top 10) is below this")
    ngram_size: int = Field(12, ge=1, le=1024, description='speculative="ngram-simple": tokens looked up')
    # None: "ngram-mod" takes the pin's (24, 48, 64); "auto" chooses from what a drafted row costs, measured from
    # the engine's decodes (high/ngram_mod.py's REGIMES), the pin's until it is measured.
    ngram_mod_n_match: int | None = Field(None, ge=1, le=1024, description='"ngram-mod" and "auto": the tokens an '
                                          "n-gram has (llama-server's --spec-ngram-mod-n-match; None: 24, or "
                                          "\"auto\"'s choice)")
    ngram_mod_n_min: int | None = Field(None, ge=0, le=1024, description='"ngram-mod" and "auto": shorter drafts '
                                        'are dropped (--spec-ngram-mod-n-min; None: 48, or "auto"\'s choice)')
    ngram_mod_n_max: int | None = Field(None, ge=1, le=1024, description='"ngram-mod" and "auto": the most tokens '
                                        'drafted per step (--spec-ngram-mod-n-max; None: 64, or "auto"\'s choice)')
    context_shift: bool = Field(
        False, description="a generating sequence that fills its share of the context drops half of its tokens "
                            "(after the BOS) and goes on, as llama-server's --context-shift; its reply then "
                            "ends only by max_tokens, a stop or the end of generation. Off (and for a request "
                            "with media, whose positions cannot move): it ends at the full context "
                            "(StopReason.CONTEXT_FULL)")
    # Benchmarking only (llama-server's --spec-synth-*): the output is not the model's (high/speculative.py).
    draft_synth_rates: list[float] | None = Field(
        None, description="benchmarking only: each draft position's guess is accepted at random at this "
                          "unconditional rate, whatever the model samples (one rate per drafted token, "
                          "non-increasing, in [0, 1]); the output is not valid text (llama-server's "
                          "--spec-synth-rates)")
    draft_synth_len: float | None = Field(
        None, description="benchmarking only: as draft_synth_rates, the rates p, p^2, ... that give this mean "
                          "accepted length, the model's token included, in [1, most drafted + 1] "
                          "(llama-server's --spec-synth-len)")

    @model_validator(mode="after")
    def _one_drafter(self) -> LlamaParams:
        if self.speculative not in (None, "none") and self.draft_model_path is not None:
            raise ValueError(f"speculative={self.speculative!r} and draft_model_path exclude each other: choose one "
                             "way to draft")
        return self

    def drafted_max(self) -> int:
        """The most tokens a drafter guesses per step and sequence (0: no drafting)."""
        if self.draft_model_path is not None:
            return self.draft_max
        if self.speculative in ("auto", "ngram-mod"):
            return self.ngram_mod_n_max or 64
        if self.speculative in ("ngram", "ngram-simple"):
            return self.draft_max
        return 0

    def __init__(self, model_path: str | os.PathLike[str] | None = None, **data: Any):
        if model_path is not None:
            data["model_path"] = model_path
        super().__init__(**data)

    def model_params(self) -> ModelParams:
        return ModelParams(**{k: getattr(self, k) for k in ModelParams.model_fields})

    def context_params(self) -> ContextParams:
        return ContextParams(**{k: getattr(self, k) for k in ContextParams.model_fields})


SAMPLER_ORDER = ("penalties", "dry", "top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc", "temperature")
SamplerName = Literal["penalties", "dry", "top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc",
                      "temperature", "infill", "adaptive_p"]


class SamplerParams(Params):
    """Sampling settings with common_params_sampling's defaults; SamplerChain.from_params builds llama.cpp's chain.

    `samplers` is the order of the chain (llama.cpp's default order); mirostat (1 or 2)
    replaces it; temperature <= 0 samples greedily. `grammar` is GBNF text.
    """

    temperature: float = Field(0.8, description="softmax temperature; <= 0 = greedy (argmax)")
    top_k: int = Field(40, description="keep the k most likely tokens; <= 0 = the whole vocabulary")
    top_p: float = Field(
        0.95, ge=0.0, le=1.0,
        description="nucleus: keep the fewest tokens whose probabilities reach p; 1.0 = off")
    min_p: float = Field(
        0.05, ge=0.0, le=1.0,
        description="drop tokens less likely than min_p x the top token's probability; 0.0 = off")
    typical_p: float = Field(1.0, ge=0.0, le=1.0, description="locally typical sampling with mass p; 1.0 = off")
    min_keep: int = Field(0, ge=0, description="the fewest tokens top_p/min_p/typical/xtc keep (0: their own)")
    dynatemp_range: float = Field(
        0.0, ge=0.0,
        description="dynamic temperature: temperature +/- range, by the candidates' entropy; 0.0 = off")
    dynatemp_exponent: float = Field(1.0, gt=0.0, description="dynamic temperature: how entropy maps to temperature")
    xtc_probability: float = Field(
        0.0, ge=0.0, le=1.0,
        description="XTC: the chance per step of removing the top choices; 0.0 = off")
    xtc_threshold: float = Field(
        0.1,
        description="XTC: tokens above this probability (all but the least of them) are removed; > 0.5 = off")
    top_n_sigma: float = Field(-1.0, description="keep tokens within n standard deviations of the top logit; -1 = off")
    penalty_last_n: int = Field(
        64, ge=-1,
        description="how many recent tokens the penalties look at; 0 = off, -1 = the context size")
    penalty_repeat: float = Field(1.0, gt=0.0, description="repetition penalty on recent tokens' logits; 1.0 = off")
    penalty_freq: float = Field(
        0.0,
        description="frequency penalty, subtracted per occurrence in the recent tokens; 0.0 = off")
    penalty_present: float = Field(
        0.0,
        description="presence penalty, subtracted once for a token in the recent tokens; 0.0 = off")
    dry_multiplier: float = Field(0.0, ge=0.0, description="DRY (don't repeat yourself) penalty strength; 0.0 = off")
    dry_base: float = Field(
        1.75,
        description="DRY: the penalty is multiplier x base ^ (repeat length - allowed length)")
    dry_allowed_length: int = Field(2, ge=0, description="DRY: repeats longer than this many tokens are penalised")
    dry_penalty_last_n: int = Field(
        64, ge=0,
        description="DRY: how many recent tokens are scanned for repeats; 0 = off")
    dry_sequence_breakers: list[str] = Field(
        default_factory=lambda: ["\n", ":", "\"", "*"],
        description="DRY: strings that end a repeated sequence")
    mirostat: Literal[0, 1, 2] = Field(
        0,
        description="0 = off, 1 = Mirostat, 2 = Mirostat 2.0 (it replaces the samplers list)")
    mirostat_tau: float = Field(5.0, description="Mirostat target entropy (surprise)")
    mirostat_eta: float = Field(0.1, description="Mirostat learning rate")
    adaptive_target: float = Field(
        -1.0,
        description="adaptive-p: select tokens near this probability (0.0-1.0; negative = off)")
    adaptive_decay: float = Field(
        0.9, ge=0.0, le=0.99,
        description="adaptive-p: EMA decay; the history is about 1 / (1 - decay) tokens")
    samplers: list[SamplerName] = Field(
        default_factory=lambda: list(SAMPLER_ORDER),
        description="the samplers of the chain, in order (llama.cpp's default order)")
    grammar: str | None = Field(None, description="GBNF grammar the output must match; None = free text")
    logit_bias: dict[int, float] = Field(
        default_factory=dict,
        description="token id -> bias added to its logit (-inf bans it)")
    seed: int = Field(
        0xFFFFFFFF, ge=0, le=0xFFFFFFFF,
        description="seed of the chain's dist / mirostat sampler; 0xFFFFFFFF (LLAMA_DEFAULT_SEED) = random")

    def build_chain(self, model: Any) -> Any:
        """Seed 004's spelling of SamplerChain.from_params(self, model): the chain for `model`'s vocabulary.

        The model (a LlamaModel) builds it: the samplers are a higher layer than these params.
        """
        build = getattr(model, "sampler_chain", None)
        if build is None:
            raise InvalidParameterError(f"build_chain needs a LlamaModel, got {type(model).__name__}", field="model")
        return build(self)
