"""A request to the engine: a prompt to continue, its rules, and where its events go."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..blocks.sampling import LlamaSampler
from .completion import CompletionChunk, TextAssembler


@dataclasses.dataclass(eq=False)
class Job:
    """One request: a prompt to continue, and where its events go."""

    prompt: list[int]
    max_tokens: int | None
    sampler: LlamaSampler
    stops: list[str]
    n_logprobs: int | None = None
    own_sampler: bool = False
    sink: Callable[[CompletionChunk | BaseException], None] = print
    media: Any = None  # an MtmdInputChunks (plugin llamaplug-mtmd) in place of `prompt`'s tokens
    # Special tokens whose text the reply keeps (the chat layer's preserved tokens: a template's <tool_call>).
    render_special: frozenset[int] = frozenset()
    # A chunk with `progress` when the prompt starts and after each batch of it (llama-server's return_progress)
    progress: bool = False
    cancelled: bool = False
    done: bool = False
    # Filled in while it runs.
    text: TextAssembler = dataclasses.field(init=False)
    produced: int = 0
    cached: int = 0
    started: float = 0.0
    first_token: float = 0.0
    drafted: int = 0
    accepted: int = 0
    shifts: int = 0  # context shifts (engine.py: LlamaParams.context_shift)
    stop_string: str | None = None  # the stop string that ended it (StopReason.STOP_SEQUENCE)

    def __post_init__(self) -> None:
        self.text = TextAssembler(self.stops)

    def cancel(self) -> None:
        """Stop at the next step (from any thread): the last event says StopReason.CANCELLED."""
        self.cancelled = True

    @property
    def n_prompt(self) -> int:
        """Positions the prompt takes (media included)."""
        return len(self.prompt) if self.media is None else int(self.media.n_pos)
