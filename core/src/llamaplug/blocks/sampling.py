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
  removed, a grammar made to accept a token it refuses, any C++ exception a sampler
  throws) is a `SamplingError`: every native sampler call goes through catching
  helpers (core/native/sampler_shim.cpp), and a pick is checked against the chain's
  grammars before they accept it. A chain that failed so raises again until `reset()`.

A sampler added to a chain belongs to the chain from then on.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import plugins
from ..errors import ClosedError, InvalidParameterError, InvalidTokenError, SamplingError, check_ptr
from ..params import SamplerParams
from ..raw import ffi, lib
from . import _callback_errors, py_sampler
from ._handle import NativeHandle
from ._text import encode_text
from .chat_layer import grammar_prefill, reasoning_budget_ptr
from .grammar import Grammar
from .sampling_params import add_common_samplers

if TYPE_CHECKING:
    from .context import LlamaContext
    from .model import LlamaModel

DEFAULT_SEED = 0xFFFFFFFF
# Samplers that pick the token (set `selected`); every other one only reshapes the candidates.
SELECTING = frozenset({"greedy", "dist", "mirostat", "mirostat_v2", "adaptive_p"})
GRAMMARS = ("grammar", "grammar_lazy")
DRY_BREAKERS = ("\n", ":", "\"", "*")  # llama.cpp's default sequence breakers
_NO_TOKEN = {
    1: "selected no token",
    4: "removed every candidate (all of them had probability 0: a logit bias of -inf on every token?)",
}
# The sampling helpers' statuses (raw/declarations.py) past _NO_TOKEN's and 2 (no logits).
_REFUSED, _APPLY_THREW, _GRAMMAR_ACCEPT_THREW, _CHAIN_ACCEPT_THREW = 5, 6, 7, 8


def _native_message() -> str:
    return ffi.string(lib.llamaplug_sampler_last_error()).decode("utf-8", "replace") or "no message"


def sampling_failure(what: str, status: int, token: int) -> SamplingError:
    """The one mapping of a sampling helper's status (not 0 or 2) to the error naming the sampler and token."""
    if status in _NO_TOKEN:
        return SamplingError(f"the sampler {what} {_NO_TOKEN[status]}; nothing was sampled")
    if status == _REFUSED:
        return SamplingError(f"the sampler {what} picked token {token}, which its grammar does not allow (a "
                             "sampler after the grammar, or a logit bias, raised a token the grammar masked); "
                             "nothing was sampled")
    if status == _APPLY_THREW:
        return SamplingError(f"a sampler of {what} failed in llama.cpp: {_native_message()}; nothing was sampled")
    if status in (_GRAMMAR_ACCEPT_THREW, _CHAIN_ACCEPT_THREW):
        part = "the grammar of " if status == _GRAMMAR_ACCEPT_THREW else ""
        return SamplingError(f"{part}the sampler {what} failed in llama.cpp accepting token {token}: "
                             f"{_native_message()}")
    return SamplingError(f"the sampler {what} failed (status {status})")


def _check(name: str, ok: bool, message: str) -> None:
    if not ok:
        raise InvalidParameterError(f"{name}: {message}", field=name)


class LlamaSampler(NativeHandle):
    """One llama.cpp sampler (or a chain of them)."""

    _what = "sampler"

    def __init__(self, ptr: Any, name: str):
        check_ptr(ptr, InvalidParameterError, f"llama.cpp refused to create sampler {name}", field=name)
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
        _check_share(name, p, min_keep)
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
        self._check_usable()
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
        status = self._sample_native(ptr, raw_ctx, idx, cands, self._token_out)
        _callback_errors.raise_stored()  # a Python sampler's exception, once the native call is over
        if status == 2:
            raise InvalidParameterError(f"no logits for batch index {idx}", field="idx")
        if status:
            error = sampling_failure(self._describe(), status, int(self._token_out[0]))
            if status > _REFUSED:  # llama.cpp threw: some samplers took the token, some did not
                self._failed = str(error)
            raise error
        return int(self._token_out[0])

    def _sample_native(self, ptr: Any, raw_ctx: Any, idx: int, cands: Any, out: Any) -> int:
        # a chain passes the grammars inside it (SamplerChain._checks), each pick checked against them
        checks, n_checks = getattr(self, "_checks", ffi.NULL), getattr(self, "_n_checks", 0)
        return int(lib.llamaplug_sample_checked(ptr, checks, n_checks, raw_ctx, idx, cands, len(cands), out))

    def _describe(self) -> str:
        return self.name

    def accept(self, token: int) -> None:
        """Feed `token` to the samplers' state (penalties, mirostat, grammar); see the module's rules."""
        if getattr(self, "_just_sampled", None) == token:
            self._just_sampled = None  # sample() accepted it already
            return
        self._just_sampled = None
        self._check_usable()
        threw = lib.llamaplug_sampler_accept_checked(self._ptr, token)
        _callback_errors.raise_stored()
        if threw:
            error = sampling_failure(self._describe(), _CHAIN_ACCEPT_THREW, token)
            self._failed = str(error)
            raise error

    def reset(self) -> None:
        self._just_sampled = None
        threw = lib.llamaplug_sampler_reset_checked(self._ptr)
        _callback_errors.raise_stored()
        if threw:
            raise SamplingError(f"the sampler {self._describe()} failed in llama.cpp resetting: {_native_message()}")
        self._failed = None

    def _check_usable(self) -> None:
        failed = getattr(self, "_failed", None)
        if failed:
            raise SamplingError(f"the sampler {self._describe()} failed earlier and its state is not consistent "
                                f"(reset() it, or build a new one): {failed}")

    @classmethod
    def from_python(cls, obj: Any, name: str | None = None) -> LlamaSampler:
        """`obj` (with apply(candidates), optionally accept/reset/clone) as a native llama.cpp sampler."""
        name = name or type(obj).__name__
        sampler = cls(py_sampler.native_sampler(obj, name), name)
        sampler.selects = bool(getattr(obj, "selects", False))
        return sampler

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
    check_ptr(raw_ctx, InvalidParameterError, "the raw context handle is NULL", field="ctx")
    return int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(lib.llama_get_model(raw_ctx))))


def _argmax(ctx: LlamaContext, idx: int) -> int:
    # Greedy has no state to accept into, and llama_sampler_sample would first copy the
    # whole vocabulary into candidate records and run every sampler before it (60-400 us a
    # token here); argmax over the logits view picks the same token. Of equal maxima it takes
    # the first, as llama.cpp's greedy does when nothing before it reordered the candidates
    # (top_k's partial sort leaves equal logits in no set order).
    ctx.check_output_index(idx)  # a bad index is reported before a closed context, as llama_sampler_sample's path does
    return int(ctx._logits_row(idx).argmax())


@dataclasses.dataclass(frozen=True)
class _Target:
    """What a chain's samplers are built for: the vocabulary (some samplers need it) and the chain's seed."""

    n_vocab: int | None
    vocab: Any  # llama_vocab * or None
    seed: int

    def vocab_size(self, name: str) -> int:
        if self.n_vocab is None:
            raise InvalidParameterError(
                f"the {name} sampler needs the vocabulary size: sample with a context first, "
                "or create SamplerChain(model=model)", field="n_vocab")
        return self.n_vocab

    def vocabulary(self, name: str) -> Any:
        if self.vocab is None:
            raise InvalidParameterError(
                f"the {name} sampler needs the model's vocabulary: sample with a context first, "
                "or create SamplerChain(model=model)", field="model")
        return self.vocab

    def seed_or(self, seed: int | None) -> int:
        return self.seed if seed is None else seed


class SamplerChain(LlamaSampler):
    """A chain of samplers; each fluent method appends one and returns the chain.

    The native chain is built at first use, because some samplers (penalties,
    logit_bias, dry, grammar) need the model's vocabulary, known only once a
    context is at hand; pass `model` (or `n_vocab`) to build it earlier. See the
    module's rules for the `dist` appended to a chain that would not select a
    token, and for `seed` (also the seed of xtc, mirostat and adaptive_p when
    they are not given one).
    """

    def __init__(self, no_perf: bool = False, n_vocab: int | None = None, seed: int | None = None,
                 model: LlamaModel | None = None):
        if seed is not None:
            _check("seed", 0 <= seed <= 0xFFFFFFFF, f"must be a uint32, got {seed}")
        self.name = "chain"
        self.names: list[str] = []
        self.default_seed = seed
        self._no_perf = no_perf
        self._model = model
        self._n_vocab = model.n_vocab if model is not None else n_vocab
        self._parts: list[Callable[[_Target], Any]] = []
        self._target: _Target | None = None
        self._built = False
        self._closed = False
        self._auto_dist = False
        self._has_grammar = False
        self._selecting_at = -1  # len(names) right after a Python sampler that selects was added
        self._grammar: LlamaSampler | None = None  # a leading grammar, sampled apart from the native chain
        self._leading_constraint = False  # names[0] is a plugin's constraint (constrained), sampled as a grammar
        self._checks: Any = ffi.NULL  # the grammars inside the native chain (see _build)
        self._n_checks = 0
        self._keeps_top: list[bool] = []  # per sampler: it never changes which token is the most likely
        self._argmax_picks = False  # greedy last, after samplers that all keep the most likely token

    def _build(self, n_vocab: int | None = None, vocab: Any = None) -> None:
        if self._closed:
            raise ClosedError("this sampler chain is closed")
        if self._built:
            return
        if not self._parts:
            raise InvalidParameterError("the sampler chain is empty: add a sampler, e.g. greedy() or dist(seed)",
                                        field="sampler")
        if vocab is None and self._model is not None:
            vocab = self._model._vocab_ptr
        seed = DEFAULT_SEED if self.default_seed is None else self.default_seed
        target = self._target = _Target(n_vocab or self._n_vocab, vocab, seed)
        made: list[Any] = []
        try:
            for make in self._parts:
                try:
                    made.append(_native(make(target)))
                except (OverflowError, TypeError) as exc:  # cffi's conversion of an option to its C type
                    name = self.names[len(made)] if len(made) < len(self.names) else "sampler"
                    raise InvalidParameterError(f"{name}: an option does not fit its C type ({exc})",
                                                field=name) from None
        except BaseException:  # all or nothing: a refused part leaks none made before it
            for sampler in made:
                lib.llama_sampler_free(sampler)
            raise
        # Grammars inside the native chain (not owned here): each pick is checked against them before they
        # accept it (see llamaplug_pick_checked).
        inner = [ptr for name, ptr in zip(self.names, made) if name in GRAMMARS]
        if (self.names[0] in GRAMMARS or self._leading_constraint) and len(made) > 1:
            # Sampled apart, the way llama.cpp's common sampler does (see llamaplug_sample_grammar_checked):
            # the chain's pick is checked on its own, and only a refused one costs the whole-vocabulary mask.
            self._grammar = LlamaSampler(made.pop(0), self.names[0])
            if self.names[0] in GRAMMARS:
                inner.pop(0)
        self._checks = ffi.new("struct llama_sampler *[]", inner) if inner else ffi.NULL
        self._n_checks = len(inner)
        params = lib.llama_sampler_chain_default_params()
        params.no_perf = self._no_perf
        ptr = lib.llama_sampler_chain_init(params)
        self._adopt(ptr, lib.llama_sampler_free)
        self._built = True
        for sampler in made:
            lib.llama_sampler_chain_add(ptr, sampler)
        self._parts.clear()
        if self.names[-1] not in SELECTING and self._selecting_at != len(self.names):
            lib.llama_sampler_chain_add(ptr, LlamaSampler.dist(seed)._give_away())
            self._auto_dist = True

    def prepare(self, model: Any) -> SamplerChain:
        """Build the native chain for `model` now, so that a bad option is raised here, not at the first sample."""
        self._build(model.n_vocab, model._vocab_ptr)
        return self

    def select_with(self, seed: int) -> SamplerChain:
        """The chain's seed (see the class doc) when it was given none and has not sampled yet."""
        if self.default_seed is None and not self._built:
            _check("seed", 0 <= seed <= 0xFFFFFFFF, f"must be a uint32, got {seed}")
            self.default_seed = seed
        return self

    @property
    def _ptr(self) -> Any:
        self._build()
        return super()._ptr

    @property
    def closed(self) -> bool:
        return self._closed

    def sample(self, ctx: LlamaContext | Any, idx: int = -1) -> int:
        if self._closed:  # before the context is asked anything
            raise ClosedError("this sampler chain is closed")
        raw = isinstance(ctx, ffi.CData)
        if not self._built:
            if raw:
                self._build(_raw_n_vocab(ctx), lib.llama_model_get_vocab(lib.llama_get_model(ctx)))
            else:
                ctx.check_output_index(idx)  # a bad index is named before a closed model or context
                self._build(ctx.n_vocab, ctx.model._vocab_ptr)
        if self._argmax_picks and not raw:
            return _argmax(ctx, idx)
        return super().sample(ctx, idx)

    def accept(self, token: int) -> None:
        if self._has_grammar and getattr(self, "_just_sampled", None) != token:
            # llama.cpp's grammar aborts the process on a token it does not allow.
            raise InvalidParameterError(
                f"token {token} was not sampled by this chain: a chain with a grammar accepts only its own samples",
                field="token")
        if getattr(self, "_just_sampled", None) != token and self._leading_constraint:
            self._build()
            if self._grammar is not None:  # the constraint sampled apart takes the token first (and may refuse it)
                self._grammar.accept(token)
        super().accept(token)

    def reset(self) -> None:
        super().reset()
        if self._grammar is not None:
            self._grammar.reset()

    def close(self) -> None:
        if self._grammar is not None:
            self._grammar.close()
        self._closed = True
        self._parts.clear()
        super().close()

    def _sample_native(self, ptr: Any, raw_ctx: Any, idx: int, cands: Any, out: Any) -> int:
        if self._grammar is None:
            return super()._sample_native(ptr, raw_ctx, idx, cands, out)
        return int(lib.llamaplug_sample_grammar_checked(self._grammar._ptr, ptr, self._checks, self._n_checks,
                                                        raw_ctx, idx, cands, len(cands), out))

    def _describe(self) -> str:
        return f"chain {' -> '.join(self.names)}" + (" -> dist (appended)" if self._auto_dist else "")

    def _append(self, name: str, make: Callable[[_Target], Any], keeps_top: bool = False) -> SamplerChain:
        """`keeps_top`: with these options the sampler never drops the most likely token nor lets
        another overtake it, so a greedy after it picks the logits' argmax (see _argmax)."""
        if self._closed:
            raise ClosedError("this sampler chain is closed")
        if self._auto_dist:
            raise InvalidParameterError(
                f"cannot add {name}: this chain has sampled, ending with the dist appended to it; "
                "build a new chain", field="sampler")
        if self._built:
            assert self._target is not None
            added = _native(make(self._target))
            lib.llama_sampler_chain_add(self._ptr, added)
            if name in GRAMMARS:
                inner = [self._checks[i] for i in range(self._n_checks)] + [added]
                self._checks, self._n_checks = ffi.new("struct llama_sampler *[]", inner), len(inner)
        else:
            self._parts.append(make)
        self._argmax_picks = name == "greedy" and all(self._keeps_top)
        self.names.append(name)
        self._keeps_top.append(keeps_top)
        self._has_grammar |= name in GRAMMARS
        return self

    def add(self, sampler: LlamaSampler | str | Any, **options: Any) -> SamplerChain:
        """Append a sampler: a LlamaSampler, a Python object with apply(candidates), or the name a
        sampler plugin registered, whose factory is called with the keyword `options`."""
        if isinstance(sampler, str):
            sampler = _plugin_sampler(sampler, options)
        elif options:
            raise InvalidParameterError("options go with a sampler plugin's name, not a sampler", field="sampler")
        if not isinstance(sampler, LlamaSampler):
            sampler = LlamaSampler.from_python(sampler)
        if sampler is self:
            raise InvalidParameterError("a chain cannot contain itself", field="sampler")
        if sampler.closed:
            raise ClosedError(f"cannot add closed sampler {sampler.name} to a chain")
        def part(target: _Target) -> LlamaSampler:
            return sampler

        part.owns = True  # type: ignore[attr-defined] - one native sampler: this part cannot be made twice
        self._append(sampler.name, part)
        if getattr(sampler, "selects", False):
            self._selecting_at = len(self.names)
        return self

    def constrained(self, grammar: Grammar | str | LlamaSampler, trigger_patterns: Sequence[str] = (),
                    trigger_tokens: Sequence[int] = (), prefill: Sequence[int] = ()) -> SamplerChain:
        """A new chain: `grammar` first, then this chain's samplers (made anew; this chain is left as it is;
        a chain holding sampler objects, which cannot be made twice, gets the grammar in front itself).

        With triggers the grammar is lazy (grammar_lazy); `prefill`: tokens the grammar accepts first
        (the template's generation prompt, for the chat layer's grammars). A LlamaSampler as `grammar` is a
        plugin's constraint (high/structured.py: llguidance's), put in front as it is and sampled the way a
        grammar is: the chain picks from the unconstrained candidates, the constraint checks that one token
        (its apply given one candidate), and only a refused pick is sampled again with the constraint first."""
        if self._built:
            raise InvalidParameterError("a grammar can be put in front of a chain that has not sampled yet only",
                                        field="sampler")
        if self._has_grammar:
            raise InvalidParameterError("this chain has a grammar already", field="sampler")
        parts = list(zip(self.names, self._parts, self._keeps_top))
        if self._holds_objects():
            # Sampler objects (add(...)) cannot be made twice: the grammar goes in front of this chain itself.
            twin, selecting = self, self._selecting_at
            self.names, self._parts, self._keeps_top = [], [], []
        else:
            twin, selecting = SamplerChain(self._no_perf, self._n_vocab, self.default_seed, self._model), -1
        if isinstance(grammar, LlamaSampler):
            twin.add(grammar)
            twin._leading_constraint = True
        elif trigger_patterns or trigger_tokens:
            twin.grammar_lazy(grammar, trigger_patterns, trigger_tokens)
        else:
            twin.grammar(grammar, prefill=prefill)
        for name, part, keeps in parts:
            twin._append(name, part, keeps)
        if selecting >= 0:
            twin._selecting_at = selecting + 1
        return twin

    def _holds_objects(self) -> bool:
        return any(getattr(part, "owns", False) for part in self._parts)

    def twin(self) -> SamplerChain:
        """A new chain of the same samplers, made anew (this chain is left as it is); a chain holding sampler
        objects (add(...)), which cannot be made twice, is given back itself."""
        if self._built:
            raise InvalidParameterError("a chain that has sampled cannot be copied", field="sampler")
        if self._holds_objects():
            return self
        twin = SamplerChain(self._no_perf, self._n_vocab, self.default_seed, self._model)
        for name, part, keeps in zip(self.names, self._parts, self._keeps_top):
            twin._append(name, part, keeps)
        return twin

    @classmethod
    def from_params(cls, params: SamplerParams, model: LlamaModel | None = None) -> SamplerChain:
        """The chain llama.cpp's common sampler builds for `params` (sampling_params.py has the order);
        with `model`, built for its vocabulary (SamplerParams.build_chain(model))."""
        return add_common_samplers(cls(seed=params.seed, model=model), params)

    def build(self) -> SamplerChain:
        """The chain itself (kept for the seeds' builder spelling)."""
        return self

    # -- every sampler of the pinned llama.h, in its argument order -------------
    def greedy(self) -> SamplerChain:  # type: ignore[override]
        return self._append("greedy", lambda t: lib.llama_sampler_init_greedy(), True)

    def dist(self, seed: int | None = None) -> SamplerChain:  # type: ignore[override]
        _check_seed(seed)
        return self._append("dist", lambda t: lib.llama_sampler_init_dist(t.seed_or(seed)))

    def temp(self, t: float) -> SamplerChain:  # type: ignore[override]
        # (t <= 0 keeps only the first of the most likely tokens: argmax's own choice)
        return self._append("temp", lambda _: lib.llama_sampler_init_temp(float(t)), True)

    def temp_ext(self, t: float, delta: float, exponent: float) -> SamplerChain:  # type: ignore[override]
        """Dynamic temperature: t +- delta by the entropy of the candidates, shaped by exponent."""
        _check("dynatemp_exponent", exponent > 0, f"must be > 0, got {exponent}")
        # A dynamic temperature may reach 0 and turn several logits into +inf: kept only without one.
        return self._append("temp_ext", lambda _: lib.llama_sampler_init_temp_ext(float(t), float(delta),
                                                                                   float(exponent)), delta <= 0)

    def top_k(self, k: int) -> SamplerChain:  # type: ignore[override]
        return self._append("top_k", lambda _: lib.llama_sampler_init_top_k(int(k)), True)

    def top_p(self, p: float, min_keep: int = 1) -> SamplerChain:  # type: ignore[override]
        _check_share("top_p", p, min_keep)
        return self._append("top_p", lambda _: lib.llama_sampler_init_top_p(float(p), min_keep), True)

    def min_p(self, p: float, min_keep: int = 1) -> SamplerChain:  # type: ignore[override]
        _check_share("min_p", p, min_keep)
        return self._append("min_p", lambda _: lib.llama_sampler_init_min_p(float(p), min_keep), True)

    def typical(self, p: float, min_keep: int = 1) -> SamplerChain:  # type: ignore[override]
        _check_share("typical", p, min_keep)
        # The most typical tokens need not include the most likely one.
        return self._append("typical", lambda _: lib.llama_sampler_init_typical(float(p), min_keep), p >= 1.0)

    def xtc(self, p: float, t: float, min_keep: int = 1, seed: int | None = None) -> SamplerChain:  # type: ignore[override]
        """Exclude top choices: with probability p, drop every token above threshold t but the least likely."""
        _check_share("xtc", p, min_keep)
        _check_seed(seed)
        return self._append("xtc", lambda tg: lib.llama_sampler_init_xtc(float(p), float(t), min_keep,
                                                                         tg.seed_or(seed)), p <= 0 or t > 0.5)

    def top_n_sigma(self, n: float) -> SamplerChain:  # type: ignore[override]
        """Keep tokens within n standard deviations of the top logit (n <= 0: off)."""
        return self._append("top_n_sigma", lambda _: lib.llama_sampler_init_top_n_sigma(float(n)), True)

    def mirostat(self, tau: float = 5.0, eta: float = 0.1, m: int = 100,  # type: ignore[override]
                 seed: int | None = None) -> SamplerChain:
        """Mirostat 1.0 (selects the token): target surprise tau, learning rate eta, m tokens for s_hat."""
        _check("mirostat_m", m >= 1, f"must be >= 1, got {m}")
        _check_seed(seed)
        return self._append("mirostat", lambda tg: lib.llama_sampler_init_mirostat(
            tg.vocab_size("mirostat"), tg.seed_or(seed), float(tau), float(eta), m))

    def mirostat_v2(self, tau: float = 5.0, eta: float = 0.1,  # type: ignore[override]
                    seed: int | None = None) -> SamplerChain:
        """Mirostat 2.0 (selects the token)."""
        _check_seed(seed)
        return self._append("mirostat_v2", lambda tg: lib.llama_sampler_init_mirostat_v2(
            tg.seed_or(seed), float(tau), float(eta)))

    def adaptive_p(self, target: float, decay: float = 0.9,  # type: ignore[override]
                   seed: int | None = None) -> SamplerChain:
        """Select tokens near probability `target` over time (selects the token; put it last)."""
        _check("adaptive_decay", 0.0 <= decay <= 0.99, f"must be in [0, 0.99], got {decay}")
        _check_seed(seed)
        return self._append("adaptive_p", lambda tg: lib.llama_sampler_init_adaptive_p(
            float(target), float(decay), tg.seed_or(seed)))

    def penalties(self, last_n: int = 64, repeat: float = 1.0, freq: float = 0.0,  # type: ignore[override]
                  present: float = 0.0) -> SamplerChain:
        LlamaSampler.penalties(1, last_n, repeat, freq, present).close()  # validates now, not at first use
        neutral = last_n == 0 or (repeat == 1.0 and freq == 0.0 and present == 0.0)
        return self._append("penalties", lambda tg: lib.llama_sampler_init_penalties(
            tg.vocab_size("penalties"), last_n, float(repeat), float(freq), float(present)), neutral)

    def dry(self, multiplier: float = 0.0, base: float = 1.75, allowed_length: int = 2,  # type: ignore[override]
            penalty_last_n: int = 64, seq_breakers: Sequence[str] = DRY_BREAKERS) -> SamplerChain:
        """DRY: penalise tokens that extend a repetition longer than allowed_length, looking back
        penalty_last_n tokens (multiplier 0 or penalty_last_n 0: off)."""
        # This llama.h has no "-1 = the context" for DRY (it clamps to 0, which turns DRY off).
        _check("dry_penalty_last_n", penalty_last_n >= 0, f"must be >= 0 (0 = off), got {penalty_last_n}")
        _check("dry_allowed_length", allowed_length >= 0, f"must be >= 0, got {allowed_length}")
        breakers = [encode_text(b, "seq_breakers") for b in seq_breakers]

        def make(tg: _Target) -> Any:
            keep = [ffi.new("char[]", b) for b in breakers]
            arr = ffi.new("const char *[]", keep) if keep else ffi.NULL
            return lib.llama_sampler_init_dry(tg.vocabulary("dry"), float(multiplier), float(base), allowed_length,
                                              penalty_last_n, arr, len(keep))

        return self._append("dry", make, multiplier == 0 or base < 1.0 or penalty_last_n == 0)

    def logit_bias(self, biases: Mapping[int, float]) -> SamplerChain:  # type: ignore[override]
        biases = dict(biases)
        return self._append("logit_bias", lambda tg: LlamaSampler.logit_bias(tg.vocab_size("logit_bias"), biases),
                            not biases)

    def grammar(self, grammar: Grammar | str, root: str = "root",  # type: ignore[override]
                prefill: Sequence[int] = ()) -> SamplerChain:
        """Only tokens the GBNF grammar allows (checked now: an invalid one is an InvalidGrammarError);
        `prefill`: tokens it accepts before the first sample (a SamplingError if it refuses one)."""
        g = grammar if isinstance(grammar, Grammar) else Grammar(grammar, root)
        first = tuple(int(t) for t in prefill)

        def make(tg: _Target) -> Any:
            ptr = g.sampler_ptr(tg.vocabulary("grammar"))
            if first:
                n_vocab = tg.vocab_size("grammar")
                bad = [t for t in first if not 0 <= t < n_vocab]
                try:
                    if bad:
                        raise InvalidTokenError(f"prefill token {bad[0]} is outside the vocabulary (0..{n_vocab - 1})",
                                                token=bad[0])
                    grammar_prefill(ptr, first)
                except BaseException:
                    lib.llama_sampler_free(ptr)
                    raise
            return ptr

        return self._append("grammar", make)

    def grammar_lazy(self, grammar: Grammar | str, trigger_patterns: Sequence[str] = (),  # type: ignore[override]
                     trigger_tokens: Sequence[int] = (), root: str = "root") -> SamplerChain:
        """The grammar, from the first match of a trigger pattern (regex) or trigger token on."""
        g = grammar if isinstance(grammar, Grammar) else Grammar(grammar, root)
        if not trigger_patterns and not trigger_tokens:
            raise InvalidParameterError("a lazy grammar needs trigger_patterns or trigger_tokens", field="grammar")
        patterns, tokens = tuple(trigger_patterns), tuple(int(t) for t in trigger_tokens)

        def make(tg: _Target) -> Any:
            n_vocab = tg.vocab_size("grammar_lazy")
            bad = [t for t in tokens if not 0 <= t < n_vocab]
            if bad:
                raise InvalidTokenError(f"trigger token {bad[0]} is outside the vocabulary (0..{n_vocab - 1})",
                                        token=bad[0])
            return g.sampler_ptr(tg.vocabulary("grammar_lazy"), True, patterns, tokens)

        return self._append("grammar_lazy", make)

    def reasoning_budget(self, start: Sequence[int], ends: Sequence[Sequence[int]], forced: Sequence[int],
                         budget: int, prefill: Sequence[int] = ()) -> SamplerChain:
        """llama-server's reasoning budget (--reasoning-budget), put first in the chain (after a leading grammar),
        as common_sampler applies it before the other samplers: after the token sequence `start`, `budget`
        tokens (-1: unlimited) may come before one of `ends` closes the thinking; then `forced` (the budget
        message and the first end tag) is forced, token by token. `prefill`: tokens it reads first (the template's
        generation prompt: a prompt that opens the thinking starts the count)."""
        if isinstance(budget, bool) or not isinstance(budget, int) or not -1 <= budget <= 2**31 - 1:
            raise InvalidParameterError(f"the reasoning budget must be an int >= -1 (-1: unlimited), got {budget!r}",
                                        field="reasoning_budget")
        if not start or not ends or not all(ends):
            raise InvalidParameterError("a reasoning budget needs start and end token sequences", field="sampler")
        if self._built:
            raise InvalidParameterError("a reasoning budget can be put in a chain that has not sampled yet only",
                                        field="sampler")
        seqs = (tuple(int(t) for t in start), tuple(tuple(int(t) for t in seq) for seq in ends),
                tuple(int(t) for t in forced), tuple(int(t) for t in prefill))

        def make(tg: _Target) -> Any:
            n_vocab = tg.vocab_size("reasoning_budget")
            bad = [t for seq in (seqs[0], *seqs[1], seqs[2], seqs[3]) for t in seq if not 0 <= t < n_vocab]
            if bad:
                raise InvalidTokenError(f"reasoning budget token {bad[0]} is outside the vocabulary "
                                        f"(0..{n_vocab - 1})", token=bad[0])
            return reasoning_budget_ptr(tg.vocabulary("reasoning_budget"), seqs[0], seqs[1], seqs[2], budget, seqs[3])

        at = 1 if self.names and self.names[0] in GRAMMARS else 0
        self._parts.insert(at, make)
        self.names.insert(at, "reasoning_budget")
        self._keeps_top.insert(at, False)
        self._argmax_picks = False  # it forces tokens: greedy no longer picks the logits' argmax
        if self._selecting_at >= 0:
            self._selecting_at += 1
        return self

    def infill(self) -> SamplerChain:  # type: ignore[override]
        """Fill-in-the-middle: merges tokens with a common prefix, prefers EOG when it dominates."""
        return self._append("infill", lambda tg: lib.llama_sampler_init_infill(tg.vocabulary("infill")))

    def __len__(self) -> int:
        return int(lib.llama_sampler_chain_n(self._ptr))

    def __bool__(self) -> bool:  # not len(): `chain or default` must not build the chain
        return True

    def __repr__(self) -> str:
        return f"<SamplerChain {' -> '.join(self.names) or 'empty'}>"


def _native(made: Any) -> Any:
    """A native sampler from a part's result, NULL-checked (a LlamaSampler gives its pointer away)."""
    if isinstance(made, LlamaSampler):
        return made._give_away()
    return check_ptr(made, InvalidParameterError, "llama.cpp refused to create a sampler with these settings",
                     field="sampler")


def _check_seed(seed: int | None) -> None:
    if seed is not None:
        _check("seed", isinstance(seed, int) and 0 <= seed <= 0xFFFFFFFF, f"must be a uint32, got {seed}")


def _check_share(name: str, p: float, min_keep: int) -> None:
    _check(name, 0.0 <= p <= 1.0, f"must be in [0, 1], got {p}")
    _check("min_keep", min_keep >= 0, f"must be >= 0, got {min_keep}")


def _check_options(name: str, factory: Callable[..., Any], options: dict[str, Any]) -> None:
    """A factory's options that do not fit its signature: an error naming the sampler and what it takes."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a builtin without one: the call itself says
    try:
        signature.bind(**options)
    except TypeError as exc:
        takes = ", ".join(str(p) for p in signature.parameters.values()) or "no options"
        raise InvalidParameterError(f"sampler plugin {name!r}: {exc}; its options: {takes}",
                                    field=f"sampler.{name}") from None


def _plugin_sampler(name: str, options: dict[str, Any]) -> LlamaSampler | Any:
    found = plugins.sampler_factories()
    if name not in found:
        raise InvalidParameterError(f"no sampler plugin registered {name!r}; registered: {sorted(found) or 'none'}",
                                    field="sampler")
    factory = found[name].factory
    _check_options(name, factory, options)
    made = factory(**options)
    if isinstance(made, LlamaSampler):
        return made
    if not callable(getattr(made, "apply", None)):
        raise InvalidParameterError(f"sampler plugin {name!r} returned {type(made).__name__}, which is neither a "
                                    "LlamaSampler nor an object with apply(candidates)", field="sampler")
    sampler = LlamaSampler.from_python(made, name)
    return sampler


def plugin_sampler(name: str, **options: Any) -> LlamaSampler:
    """The sampler the plugin that registered `name` makes with `options` (a LlamaSampler; its options checked)."""
    return _plugin_sampler(name, options)
