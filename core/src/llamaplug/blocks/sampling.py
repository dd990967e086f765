"""LlamaSampler and SamplerChain: llama.cpp's samplers, composed fluently.

    chain = SamplerChain().top_k(40).top_p(0.95, 1).temp(0.8).dist(1234)
    token = chain.sample(ctx, -1)   # llama.cpp accepts the token into the chain

Rules a user can rely on:
- A chain always selects: one that does not end with a selecting sampler (greedy,
  dist, mirostat) gets ``dist(seed)`` appended when it is first used, as llama.cpp's
  own common sampler does; the seed is ``SamplerChain(seed=...)``, or, when a
  `Llama` uses the chain, ``LlamaParams.seed``. An empty chain is an error.
- ``sample`` accepts the token it returns. ``accept`` of that same token right
  after is a no-op (seed 001 calls both), so penalties count each token once;
  ``accept`` of any other token feeds it to the samplers.
- What would abort the process in llama.cpp (nothing selected, every candidate
  removed) is a `SamplingError`.

A sampler added to a chain belongs to the chain from then on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import plugins
from ..errors import ClosedError, InvalidParameterError, InvalidTokenError, SamplingError
from ..params import SamplerParams
from ..raw import ffi, lib
from ._handle import NativeHandle

if TYPE_CHECKING:
    from .context import LlamaContext
    from .model import LlamaModel

DEFAULT_SEED = 0xFFFFFFFF
# Samplers that pick the token (set `selected`); every other one only reshapes the candidates.
SELECTING = frozenset({"greedy", "dist", "mirostat", "mirostat_v2"})
_NO_TOKEN = {
    1: "selected no token",
    4: "removed every candidate (all of them had probability 0: a logit bias of -inf on every token?)",
}


def _check(name: str, ok: bool, message: str) -> None:
    if not ok:
        raise InvalidParameterError(f"{name}: {message}", field=name)


class LlamaSampler(NativeHandle):
    """One llama.cpp sampler (or a chain of them)."""

    _what = "sampler"

    def __init__(self, ptr: Any, name: str):
        if ptr == ffi.NULL:
            raise InvalidParameterError(f"llama.cpp refused to create sampler {name}", field=name)
        self._adopt(ptr, lib.llama_sampler_free)
        self.name = name

    # -- constructors (each validates what llama.cpp would assert on) -------
    @classmethod
    def greedy(cls) -> LlamaSampler:
        return cls(lib.llama_sampler_init_greedy(), "greedy")

    @classmethod
    def dist(cls, seed: int = DEFAULT_SEED) -> LlamaSampler:
        _check("seed", 0 <= seed <= 0xFFFFFFFF, f"must be a uint32, got {seed}")
        return cls(lib.llama_sampler_init_dist(seed), "dist")

    @classmethod
    def temp(cls, t: float) -> LlamaSampler:
        return cls(lib.llama_sampler_init_temp(float(t)), "temp")

    @classmethod
    def top_k(cls, k: int) -> LlamaSampler:
        return cls(lib.llama_sampler_init_top_k(int(k)), "top_k")

    @classmethod
    def _truncating(cls, name: str, init: Any, p: float, min_keep: int) -> LlamaSampler:
        _check(name, 0.0 <= p <= 1.0, f"must be in [0, 1], got {p}")
        _check("min_keep", min_keep >= 0, f"must be >= 0, got {min_keep}")
        return cls(init(float(p), min_keep), name)

    @classmethod
    def top_p(cls, p: float, min_keep: int = 1) -> LlamaSampler:
        return cls._truncating("top_p", lib.llama_sampler_init_top_p, p, min_keep)

    @classmethod
    def min_p(cls, p: float, min_keep: int = 1) -> LlamaSampler:
        return cls._truncating("min_p", lib.llama_sampler_init_min_p, p, min_keep)

    @classmethod
    def typical(cls, p: float, min_keep: int = 1) -> LlamaSampler:
        return cls._truncating("typical", lib.llama_sampler_init_typical, p, min_keep)

    @classmethod
    def penalties(cls, n_vocab: int, last_n: int = 64, repeat: float = 1.0, freq: float = 0.0,
                  present: float = 0.0) -> LlamaSampler:
        _check("n_vocab", n_vocab > 0, f"must be > 0, got {n_vocab}")
        _check("penalty_last_n", last_n >= -1, f"must be >= -1, got {last_n}")
        _check("penalty_repeat", repeat > 0, f"must be > 0 (1.0 = off), got {repeat}")
        return cls(lib.llama_sampler_init_penalties(n_vocab, last_n, float(repeat), float(freq), float(present)),
                   "penalties")

    @classmethod
    def logit_bias(cls, n_vocab: int, biases: Mapping[int, float]) -> LlamaSampler:
        """Add `biases[token]` to each listed token's logit (-inf bans it)."""
        _check("n_vocab", n_vocab > 0, f"must be > 0, got {n_vocab}")
        items = list(dict(biases).items())
        for token, _ in items:
            if not isinstance(token, int) or not 0 <= token < n_vocab:
                raise InvalidTokenError(f"logit_bias: token id {token!r} is outside the vocabulary "
                                        f"(0..{n_vocab - 1})", token=token if isinstance(token, int) else None)
        data = ffi.new("llama_logit_bias[]", [(token, float(bias)) for token, bias in items]) if items else ffi.NULL
        return cls(lib.llama_sampler_init_logit_bias(n_vocab, len(items), data), "logit_bias")

    # -- use ---------------------------------------------------------------
    def sample(self, ctx: LlamaContext | Any, idx: int = -1) -> int:
        """Sample from the logits of output `idx` of the last batch; the token is accepted.

        `ctx` is a LlamaContext, or the raw `llama_context *` of `context.raw_handle()`.
        """
        if isinstance(ctx, ffi.CData):
            raw, n_vocab = ctx, _raw_n_vocab(ctx)
        else:
            ctx.check_output_index(idx)
            raw, n_vocab = ctx._ptr, ctx.n_vocab
        token = self._sample_checked(raw, idx, n_vocab)
        self._just_sampled = token
        return token

    def _sample_checked(self, raw_ctx: Any, idx: int, n_vocab: int) -> int:
        ptr = self._ptr
        cands = getattr(self, "_candidates", None)
        if cands is None or len(cands) < n_vocab:
            # One buffer per sampler, reused every token (llama.cpp's chain keeps one the same way).
            cands = self._candidates = ffi.new("llama_token_data[]", n_vocab)
            self._token_out = ffi.new("llama_token *")
        status = lib.llamaplug_sampler_sample(ptr, raw_ctx, idx, cands, len(cands), self._token_out)
        if status in _NO_TOKEN:
            raise SamplingError(f"the sampler {self._describe()} {_NO_TOKEN[status]}; nothing was sampled")
        if status == 2:
            raise InvalidParameterError(f"no logits for batch index {idx}", field="idx")
        if status:
            raise SamplingError(f"the sampler {self._describe()} failed (status {status})")
        return int(self._token_out[0])

    def _describe(self) -> str:
        return self.name

    def accept(self, token: int) -> None:
        """Feed `token` to the samplers' state (penalties, mirostat, grammar); see the module's rules."""
        if getattr(self, "_just_sampled", None) == token:
            self._just_sampled = None  # sample() accepted it already
            return
        self._just_sampled = None
        lib.llama_sampler_accept(self._ptr, token)

    def reset(self) -> None:
        self._just_sampled = None
        lib.llama_sampler_reset(self._ptr)

    @property
    def seed(self) -> int:
        return int(lib.llama_sampler_get_seed(self._ptr))

    def _give_away(self) -> Any:
        """Hand the native sampler to a chain: it frees it, so this object lets go."""
        raw = self._ptr
        self._raw = None
        ffi.gc(raw, None)  # detaches the destructor in place
        return raw

    def __repr__(self) -> str:
        return f"<LlamaSampler {self.name}{' closed' if self.closed else ''}>"


def _raw_n_vocab(raw_ctx: Any) -> int:
    if raw_ctx == ffi.NULL:
        raise InvalidParameterError("the raw context handle is NULL", field="ctx")
    return int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(lib.llama_get_model(raw_ctx))))


def _argmax(ctx: LlamaContext, idx: int) -> int:
    # Greedy has no state to accept into, and llama_sampler_sample would first copy the
    # whole vocabulary into candidate records (60-400 us a token here); argmax over the
    # logits view picks the same token (the first of equal maxima, as llama.cpp's greedy).
    ctx.check_output_index(idx)  # a bad index is reported before a closed context, as llama_sampler_sample's path does
    return int(ctx._logits_row(idx).argmax())


class SamplerChain(LlamaSampler):
    """A chain of samplers; each fluent method appends one and returns the chain.

    The native chain is built at first use, because some samplers (penalties,
    logit_bias) need the vocabulary size, known only once a context is at hand;
    pass `n_vocab` to build it earlier. See the module's rules for the `dist`
    appended to a chain that would not select a token, and for `seed`.
    """

    def __init__(self, no_perf: bool = False, n_vocab: int | None = None, seed: int | None = None):
        if seed is not None:
            _check("seed", 0 <= seed <= 0xFFFFFFFF, f"must be a uint32, got {seed}")
        self.name = "chain"
        self.names: list[str] = []
        self.default_seed = seed
        self._no_perf = no_perf
        self._n_vocab = n_vocab
        self._parts: list[Callable[[int | None], LlamaSampler]] = []
        self._built = False
        self._closed = False
        self._auto_dist = False

    def _build(self, n_vocab: int | None) -> None:
        if self._closed:
            raise ClosedError("this sampler chain is closed")
        if self._built:
            return
        if not self._parts:
            raise InvalidParameterError("the sampler chain is empty: add a sampler, e.g. greedy() or dist(seed)",
                                        field="sampler")
        params = lib.llama_sampler_chain_default_params()
        params.no_perf = self._no_perf
        ptr = lib.llama_sampler_chain_init(params)
        self._adopt(ptr, lib.llama_sampler_free)
        self._built = True
        for make in self._parts:
            lib.llama_sampler_chain_add(ptr, make(n_vocab or self._n_vocab)._give_away())
        self._parts.clear()
        if self.names[-1] not in SELECTING:
            seed = DEFAULT_SEED if self.default_seed is None else self.default_seed
            lib.llama_sampler_chain_add(ptr, LlamaSampler.dist(seed)._give_away())
            self._auto_dist = True

    def select_with(self, seed: int) -> SamplerChain:
        """The seed of the dist appended if this chain ends without a selecting sampler, unless it has one."""
        if self.default_seed is None and not self._built:
            _check("seed", 0 <= seed <= 0xFFFFFFFF, f"must be a uint32, got {seed}")
            self.default_seed = seed
        return self

    @property
    def _ptr(self) -> Any:
        self._build(None)
        return super()._ptr

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._parts.clear()
        super().close()

    def sample(self, ctx: LlamaContext | Any, idx: int = -1) -> int:
        raw = isinstance(ctx, ffi.CData)
        self._build(_raw_n_vocab(ctx) if raw else ctx.n_vocab)
        if self.names == ["greedy"] and not raw:
            return _argmax(ctx, idx)
        return super().sample(ctx, idx)

    def _describe(self) -> str:
        return f"chain {' -> '.join(self.names)}" + (" -> dist (appended)" if self._auto_dist else "")

    def _append(self, name: str, make: Callable[[int | None], LlamaSampler]) -> SamplerChain:
        if self._closed:
            raise ClosedError("this sampler chain is closed")
        if self._auto_dist:
            raise InvalidParameterError(
                f"cannot add {name}: this chain has sampled, ending with the dist appended to it; "
                "build a new chain", field="sampler")
        if self._built:
            lib.llama_sampler_chain_add(self._ptr, make(self._n_vocab)._give_away())
        else:
            self._parts.append(make)
        self.names.append(name)
        return self

    def add(self, sampler: LlamaSampler | str, *args: Any, **kwargs: Any) -> SamplerChain:
        """Append `sampler`, or the sampler a plugin registered as `sampler` made from args."""
        if isinstance(sampler, str):
            sampler = _plugin_sampler(sampler, args, kwargs)
        elif args or kwargs:
            raise InvalidParameterError("arguments go with a sampler plugin's name, not a sampler", field="sampler")
        if sampler is self:
            raise InvalidParameterError("a chain cannot contain itself", field="sampler")
        if sampler.closed:
            raise ClosedError(f"cannot add closed sampler {sampler.name} to a chain")
        return self._append(sampler.name, lambda n_vocab: sampler)

    @classmethod
    def from_params(cls, params: SamplerParams) -> SamplerChain:
        return chain_from_params(params)

    def build(self) -> SamplerChain:
        """The chain itself (kept for the seeds' builder spelling)."""
        return self

    def greedy(self) -> SamplerChain:  # type: ignore[override]
        return self._append("greedy", lambda n: LlamaSampler.greedy())

    def dist(self, seed: int = DEFAULT_SEED) -> SamplerChain:  # type: ignore[override]
        LlamaSampler.dist(seed).close()  # validates now, not at first use
        return self._append("dist", lambda n: LlamaSampler.dist(seed))

    def temp(self, t: float) -> SamplerChain:  # type: ignore[override]
        return self._append("temp", lambda n: LlamaSampler.temp(t))

    def top_k(self, k: int) -> SamplerChain:  # type: ignore[override]
        return self._append("top_k", lambda n: LlamaSampler.top_k(k))

    def top_p(self, p: float, min_keep: int = 1) -> SamplerChain:  # type: ignore[override]
        LlamaSampler.top_p(p, min_keep).close()
        return self._append("top_p", lambda n: LlamaSampler.top_p(p, min_keep))

    def min_p(self, p: float, min_keep: int = 1) -> SamplerChain:  # type: ignore[override]
        LlamaSampler.min_p(p, min_keep).close()
        return self._append("min_p", lambda n: LlamaSampler.min_p(p, min_keep))

    def typical(self, p: float, min_keep: int = 1) -> SamplerChain:  # type: ignore[override]
        LlamaSampler.typical(p, min_keep).close()
        return self._append("typical", lambda n: LlamaSampler.typical(p, min_keep))

    def penalties(self, last_n: int = 64, repeat: float = 1.0, freq: float = 0.0,  # type: ignore[override]
                  present: float = 0.0) -> SamplerChain:
        _check("penalty_last_n", last_n >= -1, f"must be >= -1, got {last_n}")
        return self._append("penalties", lambda n: LlamaSampler.penalties(
            _vocab_size(n, "penalties"), last_n, repeat, freq, present))

    def logit_bias(self, biases: Mapping[int, float]) -> SamplerChain:  # type: ignore[override]
        biases = dict(biases)
        return self._append("logit_bias", lambda n: LlamaSampler.logit_bias(_vocab_size(n, "logit_bias"), biases))

    def __len__(self) -> int:
        return int(lib.llama_sampler_chain_n(self._ptr))

    def __repr__(self) -> str:
        return f"<SamplerChain {' -> '.join(self.names) or 'empty'}>"


def _plugin_sampler(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LlamaSampler:
    factories = dict(plugins.collect("llamaplug_register_samplers"))
    factory = factories.get(name)
    if factory is None:
        raise InvalidParameterError(f"no sampler plugin registered {name!r} (registered: {sorted(factories)})",
                                    field="sampler")
    made = factory(*args, **kwargs)
    if not isinstance(made, LlamaSampler):
        raise InvalidParameterError(f"sampler plugin {name!r} returned {type(made).__name__}, not a LlamaSampler",
                                    field="sampler")
    return made


def _vocab_size(n_vocab: int | None, name: str) -> int:
    if n_vocab is None:
        raise InvalidParameterError(
            f"the {name} sampler needs the vocabulary size: sample with a context first, "
            "or create SamplerChain(n_vocab=model.n_vocab)", field="n_vocab")
    return n_vocab


def chain_from_params(params: SamplerParams, n_vocab: int | None = None) -> SamplerChain:
    """The chain llama.cpp's common sampler builds for these settings (temperature <= 0: greedy)."""
    chain = SamplerChain(n_vocab=n_vocab, seed=params.seed).penalties(
        params.penalty_last_n, params.penalty_repeat, params.penalty_freq, params.penalty_present)
    if params.temperature <= 0:
        return chain.greedy()
    return (chain.top_k(params.top_k).typical(params.typical_p).top_p(params.top_p)
            .min_p(params.min_p).temp(params.temperature).dist(params.seed))


def build_chain(params: SamplerParams, model: LlamaModel) -> SamplerChain:
    """Seed 004's SamplerParams.build_chain(model): the chain, sized for the model's vocabulary."""
    return chain_from_params(params, model.n_vocab)


# Seed 004 spells it as a method of the params; params.py (a lower layer) cannot import the samplers.
SamplerParams.build_chain = build_chain  # type: ignore[attr-defined]
