"""The plugin's side of the core's media hook: an `MtmdContext` as a `llamaplug.plugin_api.Projector`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .context import MtmdContext, MtmdInputChunks
from .messages import has_media, prepare_chat


class MtmdProjector:
    """What `Llama` asks of the projector of ``LlamaParams.mmproj_path``: chat messages with image and audio parts.

    The `MtmdContext` is a dependent of the model: it closes with it.
    """

    def __init__(self, context: MtmdContext):
        self.context = context

    def has_media(self, messages: Sequence[dict[str, Any]]) -> bool:
        return isinstance(messages, list) and has_media(messages)

    def chat_prompt(self, messages: Sequence[dict[str, Any]], render: Callable[[list[dict[str, Any]]], tuple[str, Any]]
                    ) -> tuple[MtmdInputChunks, Any]:
        return prepare_chat(self.context, messages, render)

    def __repr__(self) -> str:
        return f"<MtmdProjector {self.context!r}>"
