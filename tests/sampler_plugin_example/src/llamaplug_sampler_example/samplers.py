"""The example samplers (numpy): imported when a chain first asks for one, not when the plugin loads."""

from __future__ import annotations

import numpy as np


class Ban:
    """Sets the logits of `tokens` to -inf: llama.cpp's later samplers never pick them."""

    def __init__(self, tokens):
        self.tokens = np.asarray(sorted(set(tokens)), dtype=np.int32)

    def apply(self, candidates):
        candidates.logits[np.isin(candidates.ids, self.tokens)] = -np.inf


class Argmax:
    """Picks the most likely candidate itself (so no dist is appended after it)."""

    selects = True

    def __init__(self):
        self.accepted = []

    def apply(self, candidates):
        candidates.selected = int(np.argmax(candidates.logits))

    def accept(self, token):
        self.accepted.append(token)

    def reset(self):
        self.accepted.clear()


class Noop:
    """Leaves the candidates alone: the cost of a Python sampler in the chain, for the bench."""

    def apply(self, candidates):
        pass


class Explode:
    """Raises in apply for its first `times` calls, then does nothing."""

    def __init__(self, times=1):
        self.left = times

    def apply(self, candidates):
        if self.left > 0:
            self.left -= 1
            raise RuntimeError("the example sampler exploded on purpose")
