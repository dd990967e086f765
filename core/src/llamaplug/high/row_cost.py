"""What a drafted row costs, read from the engine's own decodes (issue 45: "auto" picks its n-gram length from it).

A verify batch decodes each generating slot's next token and its guesses, with logits on every row. Whether a guess
pays depends on the price of its row against what a token costs without guesses: on a GPU a row is nearly free, on
a CPU it costs from a quarter (Gemma-3 270M Q4_K_M) to two thirds (SmolLM2 Q4_1, no GEMM kernel on x86) of a
single-token decode. `RowCost` measures it from the runner's timings of generation-only steps (no prompt chunk in
the batch), with no decode of its own:

- a step of m slots and no guesses times the base, T_m (the median of the recent ones);
- a step of m slots and k guesses gives one sample, ((t - T_m) / k) / (T_m / m): one more row's time over a
  token's share of the base step (at one slot: a row over a single-token decode);
- `ratio` is the median of the recent samples, None until there are enough.

Medians, because other processes on the machine make a few decodes slow at random.
"""

from __future__ import annotations

import statistics
from collections import deque

_KEEP_BASE = 15  # recent no-guess decodes kept per slot count
_KEEP_SAMPLES = 31  # recent samples of a row's cost
MIN_SAMPLES = 4  # of each, before a base or a ratio is trusted


class RowCost:
    """The measured cost of a drafted row relative to a token of a step without guesses (see the module)."""

    def __init__(self) -> None:
        self._base: dict[int, deque[float]] = {}
        self._samples: deque[float] = deque(maxlen=_KEEP_SAMPLES)
        self.ratio: float | None = None

    def add(self, slots: int, guesses: int, seconds: float) -> None:
        """One generation-only decode: `slots` sequences' next tokens and `guesses` drafted rows in `seconds`."""
        if slots < 1 or seconds <= 0.0:
            return
        base = self._base.get(slots)
        if guesses == 0:
            if base is None:
                base = self._base[slots] = deque(maxlen=_KEEP_BASE)
            base.append(seconds)
            return
        if base is None or len(base) < MIN_SAMPLES:
            return
        t = statistics.median(base)
        self._samples.append(max(0.0, (seconds - t) / guesses) / (t / slots))
        if len(self._samples) >= MIN_SAMPLES:
            self.ratio = statistics.median(self._samples)
