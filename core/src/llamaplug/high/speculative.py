"""Speculative decoding: drafters (cheap guesses of the next tokens) and the target's check of their guesses.

The scheduler gives each generating slot a share of the step for guesses (scheduler.py); the
runner asks the drafter for them (`ask`), puts the
slot's next token and its guesses in the batch, and after the decode `verify` samples the
target at each of their rows, accepting guesses while the sampled token equals them
(llama.cpp's common_sampler_sample_and_accept_n). So the output is what the target alone
would give; a drafter only decides how many decodes that takes.

Three drafters, as the pinned llama.cpp's (`ngram_mod.py` holds the third):

- `NgramDrafter` ("ngram-simple"): the last `ngram_size` tokens are looked up, latest first,
  in the sequence's own history (prompt included); the tokens that followed the match are the
  draft. Free, and good when the output quotes the input.
- `ModelDrafter` ("draft-simple"): a small model of the same vocabulary continues the sequence
  greedily in its own context (one sequence per slot), stopping early when its top token's
  probability among its top 10 falls below `p_min`.
- `NgramModDrafter` ("ngram-mod", and "auto": the one `serve`, `run` and `chat` use by default):
  a table of the n-grams seen (every sequence's prompt and reply) maps each to the token that
  followed it; a draft follows the table from the last n tokens. "auto" adapts it per request.

`SynthAcceptance` is llama-server's benchmarking mode (--spec-synth-rates, --spec-synth-len): a
guess is accepted at random, with a set rate per position, whatever the target samples there, so
a drafter's cost can be measured at any acceptance rate. Its output is not the target's and is
not valid text.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..blocks.batch import LlamaBatch
from ..blocks.context import LlamaContext
from ..blocks.model import LlamaModel
from ..errors import DraftVocabMismatchError, InvalidParameterError, LlamaError
from .prefix_store import common_prefix

if TYPE_CHECKING:
    from .job import Job
    from .slot import Slot
    from .stats import EngineStats

log = logging.getLogger("llamaplug.speculative")

_TOP_K = 10  # llama.cpp's draft sampler: top_k(10), so a draft token's probability is among those 10
_VOCAB_SAMPLE = 64  # token texts compared between target and draft (spread over the vocabulary)


@dataclasses.dataclass
class DraftRequest:
    """One slot's ask: `history` is in the target's KV cache, `last` is about to be decoded after it."""

    seq: int
    history: list[int]
    last: int
    n_max: int
    job: object = None  # the request the sequence runs (a drafter keeping state per request sees it change)


class Drafter(Protocol):
    draft_max: int  # the most guesses it gives one sequence (the scheduler reserves rows for no more)

    def draft(self, requests: list[DraftRequest]) -> list[list[int]]:
        """Up to `n_max` guessed tokens after each request's `last` (an empty list: no guess)."""
        ...

    def decoded(self, slots: int, guesses: int, seconds: float) -> None:
        """The runner's timing of a step that decoded `slots` sequences' next tokens and `guesses` drafted rows,
        and nothing else (what a drafted row costs here: "auto" chooses its setting from it)."""
        ...

    def shifted(self, seq: int, keep: int, discard: int) -> None:
        """The target's sequence `seq` dropped its tokens [keep, keep + discard) and moved the rest down by
        `discard` (a context shift: engine.py); what the drafter keeps of that sequence follows or is dropped."""
        ...

    def close(self) -> None: ...


def ask(drafter: Drafter, wanted: Sequence[tuple[Slot, int]]) -> None:
    """Ask `drafter` for guesses after each slot's next token, at most the number paired with it (the scheduler's
    share of the step, scheduler.py); each slot's go in its `draft`."""
    if not wanted:
        return
    requests = []
    for slot, n_max in wanted:
        assert slot.next is not None
        requests.append(DraftRequest(slot.seq, slot.tokens, slot.next, n_max, slot.job))
    for (slot, n_max), guess in zip(wanted, drafter.draft(requests)):
        slot.draft = list(guess[:n_max])


def verify(slot: Slot, first: int, output: Callable[[Slot, int, int | None], int | None], stats: EngineStats,
           synth: SynthAcceptance | None = None) -> None:
    """Sample the rows of the slot's next token and its guesses (from logits row `first` on) while the samples
    equal the guesses; `output(slot, row, forced)` samples one row and hands its token on (`forced`, when not
    None, in place of the sampled one). The caller cuts the cache after `slot.tokens`, where the guesses not kept
    lie. With `synth` a guess is accepted at random instead (SynthAcceptance): the target is still sampled at its
    row (its samplers' state and random draws go on as llama-server's), and a rejected guess gives the target's
    token, as a wrong one does."""
    job = slot.job
    assert job is not None and slot.next is not None
    draft, slot.draft = slot.draft, []
    slot.consumed(1)
    # Counted as the job's own counts move: an output can end the job and answer its client, who may read
    # /metrics before this step returns (llama-server's counters then already hold the reply's draft_n).
    job.drafted += len(draft)
    stats.drafts += 1
    stats.drafted_tokens += len(draft)
    for i, guess in enumerate(draft):
        forced = synth is not None and synth.accept(job, i, guess)
        token = output(slot, first + i, guess if forced else None)
        if token != guess or (synth is not None and not forced):  # (a rejected guess ends it, even if equal)
            break
        job.accepted += 1
        stats.accepted_tokens += 1
        if slot.job is not job:  # it ended on this token (EOS, a stop, max_tokens)
            break
        slot.tokens.append(guess)
        slot.next = None
    else:
        output(slot, first + len(draft), None)


_DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed


def synth_rates(rates: Sequence[float] | None, length: float | None, n_max: int) -> list[float]:
    """The unconditional acceptance rate of each draft position that llama-server's --spec-synth-rates or
    --spec-synth-len give (the pin's common_speculative_synth_rates_resolve, its checks and messages); [] for
    neither. `n_max`: the most tokens the drafter guesses per step (0: no drafter). `length` is the mean accepted
    length counting the target's token: the rates are p, p^2, ..., p^n_max with p found by bisection.
    A bad setting is an InvalidParameterError naming draft_synth_rates or draft_synth_len."""
    if rates is None and length is None:
        return []
    field = "draft_synth_rates" if rates is not None else "draft_synth_len"
    if rates is not None and length is not None:
        raise InvalidParameterError("synthetic acceptance length and rates are mutually exclusive", field=field)
    if n_max <= 0:
        raise InvalidParameterError("synthetic acceptance requires an initialized speculative decoding context "
                                    "(a drafter: a draft model or an n-gram --spec-type)", field=field)
    if rates is not None:
        rates = [float(r) for r in rates]
        if len(rates) != n_max:
            raise InvalidParameterError(f"synthetic acceptance rates must contain {n_max} values, got {len(rates)} "
                                        "(one per draft position: the drafter's most tokens per step)", field=field)
        for i, rate in enumerate(rates):
            if not math.isfinite(rate) or not 0.0 <= rate <= 1.0:
                raise InvalidParameterError("synthetic acceptance rates must be finite and within [0, 1]",
                                            field=field)
            if i > 0 and rate > rates[i - 1]:
                raise InvalidParameterError("synthetic acceptance rates must be monotonically non-increasing",
                                            field=field)
        return rates
    assert length is not None
    length_max = n_max + 1.0
    if not math.isfinite(length) or not 1.0 <= length <= length_max:
        raise InvalidParameterError(f"synthetic acceptance length must be finite and within [1, {length_max:.0f}]",
                                    field=field)
    p = 0.0
    if length == length_max:
        p = 1.0
    elif length > 1.0:  # the pin's bisection, step for step (the same doubles)
        lo, hi = 0.0, 1.0
        for _ in range(32):
            mid = 0.5 * (lo + hi)
            total, term = 0.0, mid
            for _ in range(n_max):
                total += term
                term *= mid
            if total < length - 1.0:
                lo = mid
            else:
                hi = mid
        p = 0.5 * (lo + hi)
    out, rate = [], p
    for _ in range(n_max):
        out.append(rate)
        rate *= p
    return out


class SynthAcceptance:
    """llama-server's synthetic draft verification (server_sample_and_accept_synth), for benchmarking: the guess
    at draft position i is accepted with probability rates[i] / rates[i - 1] (given the ones before it were),
    whatever the target samples; a drafted end-of-generation token is never accepted (it would end the reply).

    The draws come from a per-request std::mt19937 seeded with the request's seed (a random one for none), each
    a std::uniform_real_distribution<double>(0, 1) of it as libstdc++ makes it, so the same seed and drafts give
    llama-server's decisions. Unlike llama-server, the target's sample at an accepted guess's row is accepted
    into the request's samplers (grammar included: a chain here always accepts what it samples), not the guess:
    a guess never reaches the grammar, but the grammar moves on by the target's token (a reply's text under
    synthetic acceptance is not valid either way). llama-server's replay after a checkpoint restore has no
    counterpart: drafting here needs a cache that can be cut back (no checkpoints)."""

    def __init__(self, rates: Sequence[float], is_eog: Callable[[int], bool]):
        self.rates = list(rates)
        self.probs: list[float] = []  # the conditional ones, as the pin's synth_probs
        previous = 1.0
        for rate in self.rates:
            self.probs.append(rate / previous if previous > 0.0 else 0.0)
            previous = rate
        self._is_eog = is_eog
        self._rngs: weakref.WeakKeyDictionary[Job, np.random.RandomState] = weakref.WeakKeyDictionary()
        log.warning("synthetic speculative acceptance is enabled for benchmarking; generated output is not valid")
        log.info("synthetic acceptance: n_max = %d, mean length = %.6f, rates = [%s]", len(self.rates),
                 1.0 + sum(self.rates), ", ".join(f"{rate:.6g}" for rate in self.rates))

    def accept(self, job: Job, i: int, guess: int) -> bool:
        """Whether the guess at draft position `i` of `job` is taken (one draw of the request's generator)."""
        rng = self._rngs.get(job)
        if rng is None:
            rng = self._rngs[job] = np.random.RandomState(_request_seed(job))
        return _canonical(rng) < self.probs[i] and not self._is_eog(guess)


def _request_seed(job: Job) -> int:
    """The request's sampling seed, as llama-server seeds its generator (task.params.sampling.seed; for the
    default seed, a random one)."""
    seed = getattr(job.sampler, "default_seed", None)  # a SamplerChain's (the request's seed)
    if seed is None:
        seed = job.sampler.seed
    return secrets.randbits(32) if seed == _DEFAULT_SEED else int(seed)


def _canonical(rng: np.random.RandomState) -> float:
    """libstdc++'s generate_canonical<double, 53> over std::mt19937: two 32-bit draws, the first the low word.
    (RandomState seeded with an int is mt19937's init_genrand, and its full-range uint32 draws are the raw
    outputs: numpy's legacy generator is frozen.)"""
    low, high = (int(x) for x in rng.randint(0, 1 << 32, size=2, dtype=np.uint32))
    value = (low + high * 4294967296.0) / 18446744073709551616.0
    return value if value < 1.0 else math.nextafter(1.0, 0.0)


class NgramDrafter:
    """Prompt-lookup drafting without a model (llama.cpp's common_ngram_simple_draft)."""

    def __init__(self, ngram_size: int, draft_max: int):
        self.n, self.m = ngram_size, draft_max
        self.draft_max = draft_max

    def draft(self, requests: list[DraftRequest]) -> list[list[int]]:
        return [ngram_draft(r.history, r.last, self.n, self.m)[:r.n_max] for r in requests]

    def decoded(self, slots: int, guesses: int, seconds: float) -> None:
        pass

    def shifted(self, seq: int, keep: int, discard: int) -> None:
        pass  # it reads the history afresh at each step

    def close(self) -> None:
        pass


def ngram_draft(tokens: list[int], last: int, n: int, m: int) -> list[int]:
    """The `m` (at most) tokens that followed the latest earlier occurrence of tokens[-n+1:] + [last].

    As llama.cpp's: no draft from a history of n + m + 1 tokens or less, nor when fewer than
    `n` tokens follow the match.
    """
    size = len(tokens)
    if size <= n + m + 1:
        return []
    pattern = tokens[size - n + 1:] + [last]
    first = pattern[0]
    for j in range(size - n - 1, 0, -1):  # latest first; position 0 is never a match (llama.cpp's)
        if tokens[j] == first and tokens[j:j + n] == pattern:
            copy = min(m, size - (j + n))
            return tokens[j + n:j + n + copy] if copy >= n else []
    return []


class ModelDrafter:
    """Greedy drafts from a small model in its own context: one sequence per slot of the target.

    The draft context keeps what it decoded per sequence; before drafting, a sequence's cache is
    cut to its common prefix with the target's history and the rest is decoded (usually nothing:
    the accepted guesses are already there).
    """

    def __init__(self, context: LlamaContext, draft_max: int, draft_min: int, p_min: float):
        self._ctx = context
        self._max, self._min, self._p_min = draft_max, draft_min, p_min
        self.draft_max = draft_max
        self._cached: list[list[int]] = [[] for _ in range(context.n_seq_max)]
        self._batch = LlamaBatch(context.n_batch, 1)

    @property
    def context(self) -> LlamaContext:
        return self._ctx

    def draft(self, requests: list[DraftRequest]) -> list[list[int]]:
        try:
            return self._draft(requests)
        except LlamaError:  # a draft is an optimisation: without one the target goes on alone
            log.warning("the draft model failed; this step goes without a draft", exc_info=True)
            for r in requests:
                self._ctx.kv_cache_seq_rm(r.seq, 0, -1)
                self._cached[r.seq] = []
            return [[] for _ in requests]

    def _draft(self, requests: list[DraftRequest]) -> list[list[int]]:
        ctx, batch = self._ctx, self._batch
        self._catch_up(requests)
        batch.clear()
        for r in requests:
            batch.add(r.last, len(r.history), r.seq, True)
            self._cached[r.seq] = r.history + [r.last]
        ctx.decode(batch)
        results: list[list[int]] = [[] for _ in requests]
        active = list(range(len(requests)))
        while active:
            rows = ctx.get_logits()
            best = rows.argmax(axis=1)
            batch.clear()
            going = []
            for row, i in enumerate(active):
                token = int(best[row])
                if self._p_min > 0.0 and _top_probability(rows[row]) < self._p_min:
                    continue
                r, out = requests[i], results[i]
                out.append(token)
                if len(out) >= min(self._max, r.n_max):
                    continue
                batch.add(token, len(r.history) + len(out), r.seq, True)
                self._cached[r.seq].append(token)
                going.append(i)
            active = going
            if active:
                ctx.decode(batch)
        return [out if len(out) >= self._min else [] for out in results]

    def _catch_up(self, requests: list[DraftRequest]) -> None:
        """Make each sequence of the draft context hold its request's history (no logits)."""
        ctx, batch = self._ctx, self._batch
        todo: list[tuple[int, int, list[int]]] = []  # (seq, first position, tokens)
        for r in requests:
            mine = self._cached[r.seq]
            keep = common_prefix(mine, r.history)
            if not ctx.kv_cache_seq_rm(r.seq, keep, -1):
                ctx.kv_cache_seq_rm(r.seq, 0, -1)
                keep = 0
            del mine[keep:]
            if keep < len(r.history):
                todo.append((r.seq, keep, r.history[keep:]))
                mine.extend(r.history[keep:])
        batch.clear()
        for seq, pos, tokens in todo:
            start = 0
            while start < len(tokens):
                room = batch.capacity - batch.n_tokens
                if room == 0:
                    ctx.decode(batch)
                    batch.clear()
                    continue
                take = tokens[start:start + room]
                batch.add_sequence(take, seq, False, pos + start)
                start += len(take)
        if batch.n_tokens:
            ctx.decode(batch)

    def decoded(self, slots: int, guesses: int, seconds: float) -> None:
        pass

    def shifted(self, seq: int, keep: int, discard: int) -> None:
        """The draft context's sequence shifts as the target's did (llama-server shifts both: its slot.mem), so
        the next draft decodes only what is new; where it cannot shift, it keeps the first `keep` tokens and
        decodes the rest again at the next draft."""
        ctx, mine = self._ctx, self._cached[seq]
        if len(mine) <= keep:
            return
        if ctx.kv_cache_can_shift:
            ctx.kv_cache_seq_discard(seq, keep, discard, len(mine))
            del mine[keep:keep + discard]
            return
        ctx.kv_cache_seq_rm(seq, keep, -1)
        del mine[keep:]

    def close(self) -> None:
        self._ctx.model.close()


def _top_probability(logits: np.ndarray) -> float:
    """The top token's probability after top_k(10) and softmax, as llama.cpp's draft sampler gives it."""
    top = np.partition(logits, -_TOP_K)[-_TOP_K:] if logits.size > _TOP_K else logits
    peak = float(top.max())
    return 1.0 / float(np.exp(top - peak).sum())


def check_vocab(target: LlamaModel, draft: LlamaModel) -> None:
    """Raise DraftVocabMismatchError when `draft` cannot guess tokens of `target`: what differs, both files."""
    problems = []
    if target.vocab_type != draft.vocab_type:
        problems.append(f"vocabulary type {target.vocab_type} vs {draft.vocab_type}")
    if target.n_vocab != draft.n_vocab:
        problems.append(f"n_vocab {target.n_vocab} vs {draft.n_vocab}")
    for name in ("bos", "eos"):
        a, b = getattr(target, name), getattr(draft, name)
        if a != b:
            problems.append(f"{name.upper()} token {a} vs {b}")
    if not problems:
        n = target.n_vocab
        for token in sorted({int(t) for t in np.linspace(0, n - 1, _VOCAB_SAMPLE)}):
            a, b = target.token_to_piece(token, special=True), draft.token_to_piece(token, special=True)
            if a != b:
                problems.append(f"token {token} is {a!r} vs {b!r}")
                break
    if problems:
        raise DraftVocabMismatchError(
            f"the draft model {Path(draft.path).name} does not share the vocabulary of the target "
            f"{Path(target.path).name}: {'; '.join(problems)} (target {target.path}, draft {draft.path})")
