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
failing stops paying for their rows.

The pin keeps a fixed 4 Mi-entry array (16 MiB) indexed by a hash of the key; a Python dict of the
n-grams' hashes measures faster here (no per-token hash loop in Python) and holds what was seen
only: it is emptied past `MAX_ENTRIES` (under 16 MiB), as the pin empties its array past a quarter
full.
Acceptance is read back from the sequence itself: the guesses of the last draft that are now in its
history were accepted (the runner keeps only those).
"""

from __future__ import annotations

import dataclasses

from .prefix_store import common_prefix
from .speculative import DraftRequest

MAX_ENTRIES = 1 << 17  # n-grams kept before the table is emptied (tests/test_drafting_default.py measures it)
_LOW = 0.25  # a round accepting less than this share of its draft is a poor one (the pin's threshold)
_RESET_AFTER = 5  # ngram-mod: poor rounds in a row that empty the table (the pin's)
_PAUSE_AFTER = 3  # auto: poor rounds in a row that pause the request's drafting
_PAUSE_FIRST, _PAUSE_MAX = 8, 256  # auto: steps without drafting, doubling while rounds stay poor
_CAP_MIN = 8  # auto: the shortest cap a poor round leaves


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
    """llama.cpp's ngram-mod over every sequence's tokens; `adaptive`: "auto" (see the module)."""

    def __init__(self, n_match: int, n_min: int, n_max: int, adaptive: bool = False):
        self.n, self.n_min, self.n_max = n_match, n_min, n_max
        self.draft_max = n_max
        self.adaptive = adaptive
        self._table: dict[int, int] = {}  # hash of an n-gram -> the token after it (a clash: one wrong guess)
        self._seqs: dict[int, _Sequence] = {}
        self.resets = 0  # times the table was emptied (tests, the log)

    def draft(self, requests: list[DraftRequest]) -> list[list[int]]:
        return [self._draft(r) for r in requests]

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
