"""Completion results (seed 001's `Completion`) and the text bookkeeping of a generation.

`TextAssembler` turns token pieces into text: UTF-8 characters split across
tokens are held until complete, and text that might be the start of a stop
sequence is held until it is known not to be one.
"""

from __future__ import annotations

import codecs
import dataclasses
import enum
from typing import Any


class StopReason(str, enum.Enum):
    EOS = "eos"
    MAX_TOKENS = "max_tokens"
    STOP_SEQUENCE = "stop_sequence"
    CONTEXT_FULL = "context_full"
    CANCELLED = "cancelled"


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """The sampled token's log probability and the `n` most likely alternatives."""

    token: int
    text: str
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclasses.dataclass(frozen=True)
class CompletionTimings:
    prompt_tokens: int
    prompt_ms: float
    predicted_tokens: int
    predicted_ms: float
    cached_tokens: int = 0  # prompt tokens found in the KV cache (a slot's earlier request), not decoded again
    drafted_tokens: int = 0  # speculative decoding: tokens a drafter guessed and the model checked
    accepted_tokens: int = 0  # ... and of those, the ones the model's own sampling agreed with

    @property
    def prompt_per_second(self) -> float:
        return 1000.0 * self.prompt_tokens / self.prompt_ms if self.prompt_ms else 0.0

    @property
    def predicted_per_second(self) -> float:
        return 1000.0 * self.predicted_tokens / self.predicted_ms if self.predicted_ms else 0.0

    @property
    def total_ms(self) -> float:
        return self.prompt_ms + self.predicted_ms


@dataclasses.dataclass(frozen=True)
class Completion:
    text: str
    tokens: list[int]
    logprobs: list[TokenLogprob] | None
    timings: CompletionTimings
    stop_reason: StopReason
    prompt_tokens: list[int] = dataclasses.field(default_factory=list)
    parsed: Any = None  # response_format=PydanticModel: the reply validated as one (structured.with_parsed)


@dataclasses.dataclass(frozen=True)
class CompletionChunk:
    """One streamed piece: new text (possibly empty while a character or stop sequence is pending)."""

    text: str
    tokens: list[int]
    logprobs: list[TokenLogprob] | None = None
    stop_reason: StopReason | None = None
    timings: CompletionTimings | None = None


class TextAssembler:
    """Accumulates token bytes into text, cutting at the first stop sequence."""

    def __init__(self, stop: list[str]):
        self.stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # everything decoded so far (before any cut)
        self.emitted = 0  # characters already handed out
        self.stopped = False

    def feed(self, piece: bytes) -> str:
        """Add a token's bytes; return the text that is now safe to emit."""
        self.text += self._decoder.decode(piece)
        if self.stop:
            # A stop may straddle earlier text: search from where it could begin.
            start = max(0, self.emitted - max(len(s) for s in self.stop) + 1)
            hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                return self._emit(len(self.text))
        return self._emit(len(self.text) - self._pending_stop_prefix())

    def finish(self) -> str:
        """Flush what is held back (an incomplete character becomes U+FFFD)."""
        if not self.stopped:
            self.text += self._decoder.decode(b"", final=True)
        return self._emit(len(self.text))

    def _pending_stop_prefix(self) -> int:
        """Length of the longest text suffix that is a proper prefix of a stop sequence."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _emit(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        out = self.text[self.emitted:upto]
        self.emitted = upto
        return out
