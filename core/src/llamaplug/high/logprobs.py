"""Log probabilities of sampled tokens, straight from the logits view."""

from __future__ import annotations

import numpy as np

from ..blocks.context import LlamaContext
from .completion import TokenLogprob


class LogprobReader:
    """`read(token, n, idx)`: the token's log-softmax and the n most likely tokens of output idx.

    The logits row is a view. The vocabulary is copied once per token, into a scratch row kept
    for the next token: exp(logits - max) in place, whose order is the logits' order for the
    top n. Never a Python loop over the vocabulary.
    """

    def __init__(self, context: LlamaContext):
        self._context = context
        self._scratch = np.empty(0, dtype=np.float32)

    def read(self, token: int, n: int, idx: int = -1) -> TokenLogprob:
        logits = self._context.get_logits_ith(idx)
        if self._scratch.size != logits.size:
            self._scratch = np.empty(logits.size, dtype=np.float32)
        scratch = self._scratch
        top = float(logits.max())
        np.subtract(logits, top, out=scratch)
        np.exp(scratch, out=scratch)
        logz = top + float(np.log(scratch.sum(dtype=np.float64)))
        best: tuple[tuple[int, float], ...] = ()
        if n:
            order = np.argpartition(scratch, -n)[-n:] if n < logits.size else np.arange(logits.size)
            order = order[np.argsort(-logits[order], kind="stable")]
            best = tuple((int(i), float(logits[i]) - logz) for i in order)
        return TokenLogprob(token, self._context.model.token_to_str(token), float(logits[token]) - logz, best)
