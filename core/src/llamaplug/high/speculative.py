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
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..blocks.batch import LlamaBatch
from ..blocks.context import LlamaContext
from ..blocks.model import LlamaModel
from ..errors import DraftVocabMismatchError, LlamaError
from .prefix_store import common_prefix

if TYPE_CHECKING:
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


def verify(slot: Slot, first: int, output: Callable[[Slot, int], int | None], stats: EngineStats) -> None:
    """Sample the rows of the slot's next token and its guesses (from logits row `first` on) while the samples
    equal the guesses; `output(slot, row)` samples one row and hands its token on. The caller cuts the cache
    after `slot.tokens`, where the guesses not kept lie."""
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
        token = output(slot, first + i)
        if token != guess:
            break
        job.accepted += 1
        stats.accepted_tokens += 1
        if slot.job is not job:  # it ended on this token (EOS, a stop, max_tokens)
            break
        slot.tokens.append(guess)
        slot.next = None
    else:
        output(slot, first + len(draft))


class NgramDrafter:
    """Prompt-lookup drafting without a model (llama.cpp's common_ngram_simple_draft)."""

    def __init__(self, ngram_size: int, draft_max: int):
        self.n, self.m = ngram_size, draft_max
        self.draft_max = draft_max

    def draft(self, requests: list[DraftRequest]) -> list[list[int]]:
        return [ngram_draft(r.history, r.last, self.n, self.m)[:r.n_max] for r in requests]

    def decoded(self, slots: int, guesses: int, seconds: float) -> None:
        pass

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
