"""Drafting without a second model: llama.cpp's ngram-mod, and "auto", the same lookup adapted per request.

A table maps each n-gram (`n_match` tokens) seen in any sequence, prompt and reply alike, to the
token that followed it (the latest one: a later sighting overwrites). A draft starts from the last
`n_match` tokens and follows the table, each guess extending the key, up to `n_max` guesses; a
chain shorter than `n_min` is no draft (a short chain is mostly chance). So a reply that quotes its
prompt, an earlier turn or another request's text is guessed whole, and one with nothing to copy
finds no chain and pays a lookup per step.

"ngram-mod" is the pin's common_speculative_impl_ngram_mod: a streak of five rounds accepting under
a quarter of the draft empties the table. "auto" (`adaptive=True`) keeps the table and works per
request instead: the draft's length follows what was accepted (doubled after a round accepted
whole, twice the accepted count otherwise), and after three poor rounds the request stops drafting
for a while (8 steps, doubling up to 256 while rounds stay poor), so a request whose guesses keep
failing stops paying for their rows. "auto" also chooses its n-gram length and longest draft from what a drafted
row costs on this machine, measured from the engine's own decodes (row_cost.py; `REGIMES`), unless they are given:
where a row is cheap (a GPU, Gemma-3 on a CPU) shorter n-grams find more to copy and their wrong guesses cost little;
where a row costs half a decode or more (SmolLM2 Q4_1 on a CPU) the pin's 24 / 48 / 64 pays best.

The pin keeps a fixed 4 Mi-entry array (16 MiB) indexed by a hash of the key; a Python dict of the
n-grams' hashes measures faster here (no per-token hash loop in Python) and holds what was seen
only: it is emptied past `MAX_ENTRIES` (under 16 MiB), as the pin empties its array past a quarter
full.
Acceptance is read back from the sequence itself: the guesses of the last draft that are now in its
history were accepted (the runner keeps only those).
"""

from __future__ import annotations

import dataclasses
import logging

from .prefix_store import common_prefix
from .row_cost import RowCost
from .speculative import DraftRequest

log = logging.getLogger("llamaplug.speculative")

MAX_ENTRIES = 1 << 17  # n-grams kept before the table is emptied (tests/test_drafting_default.py measures it)
_LOW = 0.25  # a round accepting less than this share of its draft is a poor one (the pin's threshold)
_RESET_AFTER = 5  # ngram-mod: poor rounds in a row that empty the table (the pin's)
_PAUSE_AFTER = 3  # auto: poor rounds in a row that pause the request's drafting
_PAUSE_FIRST, _PAUSE_MAX = 8, 256  # auto: steps without drafting, doubling while rounds stay poor
_CAP_MIN = 8  # auto: the shortest cap a poor round leaves


@dataclasses.dataclass(frozen=True)
class NgramSetting:
    n_match: int
    n_min: int
    n_max: int


PIN = NgramSetting(24, 48, 64)  # the pin's ngram-mod (common.h); "auto"'s until a row's cost is measured
# "auto": the setting for a drafted row's measured cost (RowCost.ratio) under each bound, the best of
# bench/drafting_replay.py's over the serving bench's chats of SmolLM2 and Gemma-3 priced at that cost
# (docs/benchmarks.md, "Drafting on by default").
REGIMES = ((0.1, NgramSetting(12, 24, 64)), (0.4, NgramSetting(12, 24, 32)), (float("inf"), PIN))
_MARGIN = 0.05  # a ratio this close past the bound of the regime in use keeps it (timings are noisy)


def choose(ratio: float | None, current: int | None = None) -> int:
    """The index in REGIMES for a row cost `ratio` (None: not measured yet, the pin's); a ratio within _MARGIN
    of the bounds of the `current` regime keeps it."""
    if ratio is None:
        return len(REGIMES) - 1 if current is None else current
    index = next(i for i, (bound, _) in enumerate(REGIMES) if ratio < bound)
    if current is not None and index != current:
        low = REGIMES[current - 1][0] if current > 0 else 0.0
        if low - _MARGIN <= ratio < REGIMES[current][0] + _MARGIN:
            return current
    return index


@dataclasses.dataclass
class _Sequence:
    """What the drafter keeps of one sequence's request."""

    job: object
    cap: int
    indexed: int = 0  # history positions whose n-gram (starting there) is in the table
    low: int = 0  # poor rounds in a row
    pause: int = 0  # steps left without drafting (auto)
    backoff: int = _PAUSE_FIRST  # the next pause's length (auto)
    pending: tuple[int, list[int]] | None = None  # (history length when drafted, the draft)


class NgramModDrafter:
    """llama.cpp's ngram-mod over every sequence's tokens; `adaptive`: "auto" (see the module).

    A setting left None is the pin's for ngram-mod, and for "auto" is chosen from the measured cost of a row
    (`decoded` feeds it); a given one is kept.
    """

    def __init__(self, n_match: int | None, n_min: int | None, n_max: int | None, adaptive: bool = False):
        self._given = NgramSetting(n_match or 0, -1 if n_min is None else n_min, n_max or 0)
        self.draft_max = n_max or max(setting.n_max for _, setting in REGIMES)  # the scheduler's rows for one
        self.adaptive = adaptive
        self.cost = RowCost() if adaptive and None in (n_match, n_min, n_max) else None
        self.regime = len(REGIMES) - 1
        self.n, self.n_min, self.n_max = self._setting(PIN)
        self._table: dict[int, int] = {}  # hash of an n-gram -> the token after it (a clash: one wrong guess)
        self._seqs: dict[int, _Sequence] = {}
        self.resets = 0  # times the table was emptied (tests, the log)

    def draft(self, requests: list[DraftRequest]) -> list[list[int]]:
        if self.cost is not None and self.cost.ratio is not None:
            self._retune(self.cost.ratio)
        return [self._draft(r) for r in requests]

    def decoded(self, slots: int, guesses: int, seconds: float) -> None:
        if self.cost is not None:
            self.cost.add(slots, guesses, seconds)

    def _setting(self, chosen: NgramSetting) -> tuple[int, int, int]:
        """`chosen` with the given settings in its place; a chosen n_min or n_max moved to fit a given one."""
        given = self._given
        n_max = given.n_max or min(self.draft_max, max(chosen.n_max, given.n_min))
        n_min = given.n_min if given.n_min >= 0 else min(chosen.n_min, n_max)
        return given.n_match or chosen.n_match, n_min, n_max

    def _retune(self, ratio: float) -> None:
        regime = choose(ratio, self.regime)
        if regime == self.regime:
            return
        self.regime = regime
        n, self.n_min, self.n_max = self._setting(REGIMES[regime][1])
        log.info('speculative="auto": a drafted row costs %.2f of a token without drafts; n-grams of %d, '
                 "drafts of %d to %d tokens", ratio, n, self.n_min, self.n_max)
        for seq in self._seqs.values():
            seq.cap = min(seq.cap, self.n_max)
        if n != self.n:  # the table's keys are n-grams of the old length: each sequence's go back in at its next step
            self.n = n
            self._table.clear()
            for seq in self._seqs.values():
                seq.indexed = 0

    def shifted(self, seq: int, keep: int, discard: int) -> None:
        """The sequence's positions moved: what was indexed of it and its pending draft start over (the table's
        n-grams stay: they are text seen, wherever it now lies)."""
        self._seqs.pop(seq, None)

    def close(self) -> None:
        self._table.clear()
        self._seqs.clear()

    def _draft(self, r: DraftRequest) -> list[int]:
        seq = self._seqs.get(r.seq)
        if seq is None or seq.job is not r.job or seq.indexed > len(r.history):
            seq = self._seqs[r.seq] = _Sequence(r.job, self.n_max)
        if seq.pending is not None:
            self._judge(seq, r.history)
        self._index(seq, r.history, r.last)
        if seq.pause:
            seq.pause -= 1
            return []
        # As the pin: the chain is followed to n_max whatever room the request has left, and one shorter than
        # n_min is no draft (near the end of max_tokens too); then the draft is cut to the room and the cap.
        out = self._follow(r.history, r.last, self.n_max)
        out = out[:min(r.n_max, seq.cap)] if len(out) >= self.n_min else []
        seq.pending = (len(r.history), out) if out else None
        return out

    def _index(self, seq: _Sequence, history: list[int], last: int) -> None:
        """Put the n-grams the sequence gained since the last step in the table, each with its next token."""
        n, table = self.n, self._table
        start = seq.indexed
        end = len(history) + 1 - n  # n-grams starting before `end` have their next token (`last` included)
        if end <= start:
            return
        tokens = tuple(history[start:]) + (last,)
        for i in range(end - start):
            table[hash(tokens[i:i + n])] = tokens[i + n]
        seq.indexed = end
        if len(table) > MAX_ENTRIES:
            self._reset(None)

    def _follow(self, history: list[int], last: int, n_max: int) -> list[int]:
        n = self.n
        if len(history) + 1 < n or n_max <= 0:
            return []
        key = (*history[len(history) + 1 - n:], last) if n > 1 else (last,)
        get = self._table.get
        out: list[int] = []
        while len(out) < n_max:
            token = get(hash(key))
            if token is None:
                break
            out.append(token)
            key = (*key[1:], token)
        return out

    def _judge(self, seq: _Sequence, history: list[int]) -> None:
        """Count the last draft's accepted guesses (those now in the history) and adapt to them."""
        assert seq.pending is not None
        at, draft = seq.pending
        seq.pending = None
        accepted = common_prefix(history[at + 1:at + 1 + len(draft)], draft)
        poor = accepted < _LOW * len(draft)
        seq.low = seq.low + 1 if poor else 0
        if not self.adaptive:
            if seq.low >= _RESET_AFTER:  # the pin's: a table that keeps guessing wrong is emptied
                self._reset(seq)
                seq.low = 0
            return
        seq.cap = min(self.n_max, seq.cap * 2) if accepted == len(draft) else max(_CAP_MIN, 2 * accepted)
        if seq.low >= _PAUSE_AFTER:
            seq.pause, seq.backoff = seq.backoff, min(_PAUSE_MAX, seq.backoff * 2)
            seq.low = 0
        elif not poor:
            seq.backoff = _PAUSE_FIRST

    def _reset(self, seq: _Sequence | None) -> None:
        """Empty the table; `seq`'s own n-grams go back in at its next step (the pin's low-acceptance reset)."""
        self._table.clear()
        self.resets += 1
        if seq is not None:
            seq.indexed = 0
