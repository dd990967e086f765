"""What a plugin may use of the core besides its public names: the plugin API.

A plugin imports the top-level ``llamaplug`` names, ``llamaplug.raw`` (the cffi layer, for a
plugin that brings its own native library), the public modules ``llamaplug.errors``,
``llamaplug.params``, ``llamaplug.probes``, ``llamaplug.catalog``, ``llamaplug.hookspecs`` and
this module; never a private module or name (``_x``). core/tests/test_layers.py holds it to that.

Here:

- ``hookimpl``: the marker for the hooks of ``llamaplug.hookspecs``.
- ``NativeHandle``: the ownership pattern of every safe object (``_adopt(ptr, free)``, ``close()``,
  ``with``, dependents closed first); a plugin's native objects subclass it.
- native logging: ``capture_errors()`` collects the warning and error lines a native call logs (to
  explain a NULL or an error code); ``native_log_callback()`` is the core's C log callback, for a
  native library that logs through its own setter (its lines then reach logger "llamaplug.native"
  and ``capture_errors``), ``native_log_sink()`` the C callback to leave it with at exit.
- error mapping: ``native_error`` (a failed native call and its logged lines -> one ``LlamaError``),
  ``native_reason``, ``raise_for_status`` (llama.cpp return codes); a plugin maps its failures with
  them rather than formatting its own.
- what hooks exchange: ``Projector`` and ``MediaPrompt`` (``llamaplug_open_projector``) and
  ``Command`` (``llamaplug_register_commands``).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._lazy import lazy_names
from .blocks._handle import NativeHandle
from .blocks._native_log import c_callback as native_log_callback
from .blocks._native_log import c_sink as native_log_sink
from .blocks._native_log import capture_errors
from .errors import native_error, native_reason, raise_for_status
from .hookspecs import hookimpl

if TYPE_CHECKING:
    from .blocks.context import LlamaContext

__all__ = [
    "Command", "MediaPrompt", "NativeHandle", "Projector", "capture_errors", "hookimpl", "lazy_names", "native_error",
    "native_log_callback", "native_log_sink", "native_reason", "raise_for_status",
]

# Chat messages in OpenAI's shape, as the caller gave them (content a string or a list of parts).
Messages = Sequence[dict[str, Any]]


@runtime_checkable
class MediaPrompt(Protocol):
    """A prompt with media in it, which the engine evaluates in place of prompt tokens."""

    @property
    def n_pos(self) -> int:
        """KV-cache positions the prompt takes (what is checked against the context window)."""

    def eval(self, llama_context: LlamaContext, n_past: int, seq_id: int, n_batch: int, logits_last: bool) -> int:
        """Decode the prompt into sequence `seq_id` of `llama_context` from `n_past`; the new n_past.

        `logits_last`: the last position gets logits (generation samples from it). Failures are LlamaErrors.
        """


@runtime_checkable
class Projector(Protocol):
    """A multimodal projector opened for a model (``LlamaParams.mmproj_path``): what `Llama`'s chat path asks of it.

    It is closed with its model (register it as a dependent of the `LlamaModel`).
    """

    def has_media(self, messages: Messages) -> bool:
        """Whether the messages have parts this projector takes (then `chat_prompt` builds the prompt)."""

    def chat_prompt(self, messages: Messages, render: Callable[[list[dict[str, Any]]], tuple[str, Any]]
                    ) -> tuple[MediaPrompt, Any]:
        """The prompt of `messages`: ``render(flat_messages) -> (prompt_text, extra)`` is the core's chat template
        step, given the messages with each media part replaced by the projector's marker in a text content;
        returns the prompt (text tokens and media) and `extra`."""


@dataclasses.dataclass(frozen=True)
class Command:
    """A `llamaplug` subcommand a plugin adds: ``llamaplug NAME ...``.

    `name` is one word, or "group word" for a subcommand of a group (``tokenizer export``). `arguments`
    adds the arguments to its argparse parser; `run(args)` runs it and returns the exit status (a
    LlamaError it raises is printed as the core's commands' are, exit status 1).
    """

    name: str
    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    help: str = ""
