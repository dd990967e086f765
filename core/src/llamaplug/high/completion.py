"""Completion results (seed 001's `Completion`) and the text bookkeeping of a generation.

`TextAssembler` turns token pieces into text: UTF-8 characters split across
tokens are held until complete, and text that might be the start of a stop
sequence is held until it is known not to be one.
"""

from __future__ import annotations

import codecs
import collections
import dataclasses
import enum
from typing import Any

from ..errors import InvalidParameterError


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
    predicted_tokens: int  # tokens sampled, an end-of-generation one too (llama.cpp's n_decoded; not in `tokens`)
    predicted_ms: float
    cached_tokens: int = 0  # prompt tokens found in the KV cache (a slot's earlier request), not decoded again
    drafted_tokens: int = 0  # speculative decoding: tokens a drafter guessed and the model checked
    accepted_tokens: int = 0  # ... and of those, the ones the model's own sampling agreed with
    context_shifts: int = 0  # times the full sequence dropped half of its tokens to go on (LlamaParams.context_shift)

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
    stop_string: str | None = None  # the stop string that ended it (StopReason.STOP_SEQUENCE)
    parsed: Any = None  # response_format=PydanticModel: the reply validated as one (structured.with_parsed)


@dataclasses.dataclass(frozen=True)
class PromptProgress:
    """How far the prompt is read (llama-server's prompt_progress): its positions, those found in the cache, those
    in the cache now (the cached ones and the ones read so far), and the milliseconds since the request started."""

    total: int
    cache: int
    processed: int
    time_ms: int


@dataclasses.dataclass(frozen=True)
class CompletionChunk:
    """One streamed piece: new text (possibly empty while a character or stop sequence is pending).

    A job that asked for it (`Job.progress`) also gets a chunk with no text for the start of its prompt and for each
    batch of it read (`progress`; its `timings` say the prompt so far)."""

    text: str
    tokens: list[int]
    logprobs: list[TokenLogprob] | None = None
    stop_reason: StopReason | None = None
    timings: CompletionTimings | None = None
    stop_string: str | None = None  # on the final chunk: the stop string that ended the generation
    progress: PromptProgress | None = None  # on a prompt progress chunk (Job.progress)


# A request's stop sequences: every one is matched against every generated character (TextAssembler), so
# their number and length are bounded. llama-server has no cap; OpenAI's API takes 4.
MAX_STOPS = 32
MAX_STOP_CHARS = 1024


def check_stops(stop: object, field: str = "stop") -> list[str]:
    """`stop` (None, a string or a list of strings) as a list; refused, naming `field`, when it is anything else,
    has more than MAX_STOPS strings, one longer than MAX_STOP_CHARS characters, or one that is not Unicode text."""
    stops = [stop] if isinstance(stop, str) else [] if stop is None else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        raise InvalidParameterError(f"{field} must be a string or a list of strings", field=field)
    if len(stops) > MAX_STOPS:
        raise InvalidParameterError(f"{field} has {len(stops)} strings; at most {MAX_STOPS} are taken", field=field)
    for i, s in enumerate(stops):
        if len(s) > MAX_STOP_CHARS:
            raise InvalidParameterError(f"{field}[{i}] is {len(s)} characters long; at most {MAX_STOP_CHARS} are "
                                        "taken", field=field)
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidParameterError(f"{field}[{i}] is not Unicode text at character {exc.start}: {exc.reason}",
                                        field=field) from None
    return list(stops)


class TextAssembler:
    """Accumulates token bytes into text, cutting at the first stop sequence.

    The stops are matched by one Aho-Corasick automaton (_StopMatcher): each new character costs a
    bounded number of steps whatever the number and length of the stops, and its state is at once the
    text to hold back (the longest suffix that may begin a stop). Only that held text is kept, so a
    token's work does not grow with the text generated before it.
    """

    def __init__(self, stop: list[str], whole_chars: bool = False):
        self.stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # A chat reply is read by its format's parser when it ends: an incomplete last character (max_tokens cut
        # inside one) read as U+FFFD is not the start of the format's markup it was (DeepSeek V3.1's
        # "<｜tool▁calls▁end｜>" cut inside "｜": the parser refused the reply), so it is dropped, as llama-server's
        # stream never sends it.
        self.whole_chars = whole_chars
        self._matcher = _StopMatcher(self.stop) if self.stop else None
        self._state = 0
        self._held = ""  # decoded, not yet handed out
        self.stopped = False
        self.matched: str | None = None  # the stop string found (the first to start; the first listed of a tie)

    def feed(self, piece: bytes) -> str:
        """Add a token's bytes; return the text that is now safe to emit."""
        new = self._decoder.decode(piece)
        matcher = self._matcher
        if matcher is None:
            return new
        held = self._held + new
        state, cut = matcher.scan(self._state, new, len(held))
        if cut is not None:
            self.matched = next((s for s in self.stop if held.startswith(s, cut)), None)
            self._held, self.stopped = "", True
            return held[:cut]
        self._state = state
        keep = matcher.depth[state]
        self._held = held[len(held) - keep:] if keep else ""
        return held[:len(held) - keep]

    def finish(self) -> str:
        """Flush what is held back (an incomplete character becomes U+FFFD; with whole_chars it is dropped)."""
        if self.stopped:
            return ""
        if self.whole_chars:
            self._decoder.reset()
        out = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return out


class _StopMatcher:
    """Aho-Corasick automaton over the stop sequences (a trie with failure links).

    A state is a trie node: the longest suffix of the text read that is a prefix of some stop.
    `ends[n]` is the length of the longest stop that ends at node n (0: none), so a match is
    seen at its last character and its start is known.
    """

    def __init__(self, stops: list[str]):
        goto: list[dict[str, int]] = [{}]
        depth, ends = [0], [0]
        for s in stops:
            node = 0
            for ch in s:
                nxt = goto[node].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[node][ch] = nxt
                    goto.append({})
                    depth.append(depth[node] + 1)
                    ends.append(0)
                node = nxt
            ends[node] = len(s)
        fail = [0] * len(goto)
        queue = collections.deque(goto[0].values())
        while queue:
            node = queue.popleft()
            for ch, child in goto[node].items():
                f = fail[node]
                while f and ch not in goto[f]:
                    f = fail[f]
                fail[child] = goto[f].get(ch, 0)
                ends[child] = ends[child] or ends[fail[child]]
                queue.append(child)
        self.goto, self.fail, self.depth, self.ends = goto, fail, depth, ends

    def scan(self, state: int, new: str, end: int) -> tuple[int, int | None]:
        """Read `new` (the last characters of a held text `end` long) from `state`: the state after it and
        where the earliest-starting stop that ends within `new` begins in the held text (None: no stop)."""
        goto, fail, ends = self.goto, self.fail, self.ends
        cut = None
        at = end - len(new)
        for ch in new:
            at += 1
            while True:
                nxt = goto[state].get(ch)
                if nxt is not None:
                    state = nxt
                    break
                if not state:
                    break
                state = fail[state]
            if ends[state]:
                start = at - ends[state]
                cut = start if cut is None else min(cut, start)
        return state, cut
