"""llama-cpp-python's logits processors and stopping criteria, run inside llamaplug's sampler chain.

A logits processor is `f(input_ids, scores) -> scores` and a stopping criterion
`f(input_ids, logits) -> bool`, both on numpy arrays (`input_ids`: the prompt and the tokens
generated so far; `scores`: the next token's logits, one per vocabulary entry). `Stage` is the
Python sampler that calls them: it goes first in the chain, where the candidates are the whole
vocabulary in token order, so `scores` is a view of llama.cpp's candidate logits (no copy) that
a processor may change in place or replace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from llamaplug import InvalidParameterError

LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]
StoppingCriteria = Callable[[np.ndarray, np.ndarray], bool]


class LogitsProcessorList(list):
    """Logits processors applied in order, each to what the one before returned."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list):
    """Stop when any criterion says so."""

    def __call__(self, input_ids: np.ndarray, logits: np.ndarray) -> bool:
        return any([criterion(input_ids, logits) for criterion in self])


class MinTokensLogitsProcessor:
    """Forbid the end-of-sequence token until `min_tokens` tokens have been generated."""

    def __init__(self, min_tokens: int, token_eos: int):
        self.min_tokens, self.token_eos = min_tokens, token_eos
        self.prompt_tokens: int | None = None

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        if len(input_ids) - self.prompt_tokens < self.min_tokens:
            scores[self.token_eos] = -np.inf
        return scores


class Stage:
    """The chain's first sampler: keeps the token ids, runs the processors, checks the criteria.

    A criterion is asked before each token is chosen, with the ids so far (as llama-cpp-python
    asks it after choosing a token it then drops): `stopped_at` is how many tokens had been
    generated when one said stop, and `on_stop` (set by the caller to cancel its job) is called.
    """

    def __init__(self, processors: Iterable[LogitsProcessor] | None, criteria: Iterable[StoppingCriteria] | None):
        self.processors = _callables(processors, "logits_processor")
        self.criteria = _callables(criteria, "stopping_criteria")
        self.ids: list[int] = []
        self.n_prompt = 0
        self.stopped_at: int | None = None
        self.on_stop: Callable[[], Any] | None = None

    def start(self, prompt: list[int]) -> None:
        self.ids = list(prompt)
        self.n_prompt = len(self.ids)

    def apply(self, candidates: Any) -> None:
        if self.stopped_at is not None:
            return  # the job is being cancelled: what is sampled now is dropped
        ids = np.asarray(self.ids, dtype=np.intc)
        scores = candidates.logits
        if self.criteria and any(c(ids, scores) for c in self.criteria):
            self.stopped_at = len(self.ids) - self.n_prompt
            if self.on_stop is not None:
                self.on_stop()
            return
        for processor in self.processors:
            out = processor(ids, scores)
            if out is not scores:
                out = np.asarray(out, dtype=np.float32)
                if out.shape != scores.shape:
                    raise InvalidParameterError(f"a logits processor returned {out.shape} scores, not "
                                                f"{scores.shape} (one per vocabulary entry)", field="logits_processor")
                scores[:] = out
        candidates.sorted = False  # a processor may have reordered the best tokens

    def accept(self, token: int) -> None:
        self.ids.append(token)


def _callables(given: Iterable[Any] | None, field: str) -> list[Any]:
    if given is None:
        return []
    if callable(given) and not isinstance(given, list):
        given = [given]
    items = list(given)
    for i, item in enumerate(items):
        if not callable(item):
            raise InvalidParameterError(f"{field}[{i}] is not callable: {item!r}", field=f"{field}[{i}]")
    return items
