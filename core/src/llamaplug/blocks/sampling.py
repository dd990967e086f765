"""LlamaSampler and SamplerChain: llama.cpp's samplers, composed fluently.

    chain = SamplerChain().top_k(40).top_p(0.95, 1).temp(0.8).dist(1234)
    token = chain.sample(ctx, -1)   # llama.cpp accepts the token into the chain

A sampler added to a chain belongs to the chain from then on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ClosedError, InvalidParameterError
from ..params import SamplerParams
from ..raw import ffi, lib
from ._handle import NativeHandle

if TYPE_CHECKING:
    from .context import LlamaContext

DEFAULT_SEED = 0xFFFFFFFF


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

    # -- use ---------------------------------------------------------------
    def sample(self, ctx: LlamaContext, idx: int = -1) -> int:
        """Sample from the logits of output `idx` of ctx's last batch; the token is accepted."""
        if self.name == "greedy" and self._ptr:  # _ptr: a closed sampler raises ClosedError
            return _argmax(ctx, idx)
        i = ctx.check_output_index(idx)
        return int(lib.llama_sampler_sample(self._ptr, ctx._ptr, i))

    def accept(self, token: int) -> None:
        lib.llama_sampler_accept(self._ptr, token)

    def reset(self) -> None:
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


def _argmax(ctx: LlamaContext, idx: int) -> int:
    # Greedy has no state to accept into, and llama_sampler_sample would first copy the
    # whole vocabulary into candidate records (60-400 us a token here); argmax over the
    # logits view picks the same token (the first of equal maxima, as llama.cpp's greedy).
    ctx.check_output_index(idx)  # a bad index is reported before a closed context, as llama_sampler_sample's path does
    return int(ctx._logits_row(idx).argmax())


class SamplerChain(LlamaSampler):
    """A chain of samplers; each fluent method appends one and returns the chain.

    The native chain is built at first use, because some samplers (penalties)
    need the vocabulary size, known only once a context is at hand; pass
    `n_vocab` to build it earlier.
    """

    def __init__(self, no_perf: bool = False, n_vocab: int | None = None):
        self.name = "chain"
        self.names: list[str] = []
        self._no_perf = no_perf
        self._n_vocab = n_vocab
        self._parts: list[Callable[[int | None], LlamaSampler]] = []
        self._built = False
        self._closed = False

    def _build(self, n_vocab: int | None) -> None:
        if self._closed:
            raise ClosedError("this sampler chain is closed")
        if self._built:
            return
        params = lib.llama_sampler_chain_default_params()
        params.no_perf = self._no_perf
        ptr = lib.llama_sampler_chain_init(params)
        self._adopt(ptr, lib.llama_sampler_free)
        self._built = True
        for make in self._parts:
            lib.llama_sampler_chain_add(ptr, make(n_vocab or self._n_vocab)._give_away())
        self._parts.clear()

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

    def sample(self, ctx: LlamaContext, idx: int = -1) -> int:
        self._build(ctx.n_vocab)
        if self.names == ["greedy"]:
            return _argmax(ctx, idx)
        return super().sample(ctx, idx)

    def _append(self, name: str, make: Callable[[int | None], LlamaSampler]) -> SamplerChain:
        if self._closed:
            raise ClosedError("this sampler chain is closed")
        if self._built:
            lib.llama_sampler_chain_add(self._ptr, make(self._n_vocab)._give_away())
        else:
            self._parts.append(make)
        self.names.append(name)
        return self

    def add(self, sampler: LlamaSampler) -> SamplerChain:
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

        def make(n_vocab: int | None) -> LlamaSampler:
            if n_vocab is None:
                raise InvalidParameterError(
                    "the penalties sampler needs the vocabulary size: sample with a context first, "
                    "or create SamplerChain(n_vocab=model.n_vocab)", field="n_vocab")
            return LlamaSampler.penalties(n_vocab, last_n, repeat, freq, present)

        return self._append("penalties", make)

    def __len__(self) -> int:
        return int(lib.llama_sampler_chain_n(self._ptr))

    def __repr__(self) -> str:
        return f"<SamplerChain {' -> '.join(self.names) or 'empty'}>"


def chain_from_params(params: SamplerParams) -> SamplerChain:
    """The chain llama.cpp's common sampler builds for these settings (temperature <= 0: greedy)."""
    chain = SamplerChain().penalties(params.penalty_last_n, params.penalty_repeat,
                                     params.penalty_freq, params.penalty_present)
    if params.temperature <= 0:
        return chain.greedy()
    return (chain.top_k(params.top_k).typical(params.typical_p).top_p(params.top_p)
            .min_p(params.min_p).temp(params.temperature).dist(params.seed))
