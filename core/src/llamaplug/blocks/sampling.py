"""LlamaSampler and SamplerChain: llama.cpp's samplers, composed fluently.

    chain = SamplerChain().top_k(40).top_p(0.95, 1).temp(0.8).dist(1234)
    token = chain.sample(ctx, -1)   # llama.cpp accepts the token into the chain

A sampler added to a chain belongs to the chain from then on.
"""

from __future__ import annotations

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
    def top_p(cls, p: float, min_keep: int = 1) -> LlamaSampler:
        _check("top_p", 0.0 <= p <= 1.0, f"must be in [0, 1], got {p}")
        _check("min_keep", min_keep >= 0, f"must be >= 0, got {min_keep}")
        return cls(lib.llama_sampler_init_top_p(float(p), min_keep), "top_p")

    @classmethod
    def min_p(cls, p: float, min_keep: int = 1) -> LlamaSampler:
        _check("min_p", 0.0 <= p <= 1.0, f"must be in [0, 1], got {p}")
        _check("min_keep", min_keep >= 0, f"must be >= 0, got {min_keep}")
        return cls(lib.llama_sampler_init_min_p(float(p), min_keep), "min_p")

    @classmethod
    def typical(cls, p: float, min_keep: int = 1) -> LlamaSampler:
        _check("typical_p", 0.0 <= p <= 1.0, f"must be in [0, 1], got {p}")
        _check("min_keep", min_keep >= 0, f"must be >= 0, got {min_keep}")
        return cls(lib.llama_sampler_init_typical(float(p), min_keep), "typical")

    @classmethod
    def penalties(cls, last_n: int = 64, repeat: float = 1.0, freq: float = 0.0, present: float = 0.0) -> LlamaSampler:
        _check("penalty_last_n", last_n >= -1, f"must be >= -1, got {last_n}")
        return cls(lib.llama_sampler_init_penalties(last_n, float(repeat), float(freq), float(present)), "penalties")

    # -- use ---------------------------------------------------------------
    def sample(self, ctx: LlamaContext, idx: int = -1) -> int:
        """Sample from the logits of output `idx` of ctx's last batch; the token is accepted."""
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


class SamplerChain(LlamaSampler):
    """A chain of samplers; each fluent method appends one and returns the chain."""

    def __init__(self, no_perf: bool = False):
        params = lib.llama_sampler_chain_default_params()
        params.no_perf = no_perf
        super().__init__(lib.llama_sampler_chain_init(params), "chain")
        self.names: list[str] = []

    def add(self, sampler: LlamaSampler) -> SamplerChain:
        if sampler is self:
            raise InvalidParameterError("a chain cannot contain itself", field="sampler")
        if sampler.closed:
            raise ClosedError(f"cannot add closed sampler {sampler.name} to a chain")
        lib.llama_sampler_chain_add(self._ptr, sampler._give_away())
        self.names.append(sampler.name)
        return self

    @classmethod
    def from_params(cls, params: SamplerParams) -> SamplerChain:
        return chain_from_params(params)

    def build(self) -> SamplerChain:
        """The chain itself (kept for the seeds' builder spelling)."""
        return self

    def greedy(self) -> SamplerChain:  # type: ignore[override]
        return self.add(LlamaSampler.greedy())

    def dist(self, seed: int = DEFAULT_SEED) -> SamplerChain:  # type: ignore[override]
        return self.add(LlamaSampler.dist(seed))

    def temp(self, t: float) -> SamplerChain:  # type: ignore[override]
        return self.add(LlamaSampler.temp(t))

    def top_k(self, k: int) -> SamplerChain:  # type: ignore[override]
        return self.add(LlamaSampler.top_k(k))

    def top_p(self, p: float, min_keep: int = 1) -> SamplerChain:  # type: ignore[override]
        return self.add(LlamaSampler.top_p(p, min_keep))

    def min_p(self, p: float, min_keep: int = 1) -> SamplerChain:  # type: ignore[override]
        return self.add(LlamaSampler.min_p(p, min_keep))

    def typical(self, p: float, min_keep: int = 1) -> SamplerChain:  # type: ignore[override]
        return self.add(LlamaSampler.typical(p, min_keep))

    def penalties(self, last_n: int = 64, repeat: float = 1.0, freq: float = 0.0,  # type: ignore[override]
                  present: float = 0.0) -> SamplerChain:
        return self.add(LlamaSampler.penalties(last_n, repeat, freq, present))

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
