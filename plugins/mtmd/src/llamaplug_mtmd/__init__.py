"""llamaplug-mtmd: images and audio in the same token stream as text (llama.cpp's libmtmd).

    mtmd = MtmdContext(mmproj_path, model, MtmdParams(n_threads=4))
    chunks = mtmd.tokenize(f"What is this? {mtmd.marker}", [MtmdBitmap.from_file("cat.png")])
    n_past = chunks.eval(llama_context, n_past=0)     # then sample as usual

Registered under the ``llamaplug`` entry-point group as ``mtmd`` (listed by `llamaplug info`). Its
hooks: ``llamaplug_open_projector`` opens ``LlamaParams(mmproj_path=...)`` for `Llama` (chat messages
with image and audio parts), ``llamaplug_describe_projector`` says for `llamaplug info --mmproj FILE`
what a projector can take.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from llamaplug.plugin_api import hookimpl, lazy_names

# Names are imported when first asked for (PEP 562): the plugin manager imports this package in every process
# that loads plugins (`llamaplug serve` among them), and its hooks need none of it until a projector is opened.
__getattr__, __dir__ = lazy_names(__name__, {
    ".context": ("DEFAULT_MARKER", "ChunkType", "MtmdBitmap", "MtmdContext", "MtmdInputChunk", "MtmdInputChunks",
                 "MtmdInputText", "MtmdParams", "capabilities"),
    ".errors": ("InvalidMmprojError", "MediaCountError", "MediaDecodeError", "MediaTooLargeError",
                "MmprojMismatchError", "MtmdError", "UnsupportedMediaError"),
    ".messages": ("has_media", "load_media", "prepare_chat", "prepare_messages", "split_media"),
    ".projector": ("MtmdProjector",),
}, globals())

if TYPE_CHECKING:
    from llamaplug import LlamaModel, LlamaParams

    from .context import (
        DEFAULT_MARKER,
        ChunkType,
        MtmdBitmap,
        MtmdContext,
        MtmdInputChunk,
        MtmdInputChunks,
        MtmdInputText,
        MtmdParams,
        capabilities,
    )
    from .errors import (
        InvalidMmprojError,
        MediaCountError,
        MediaDecodeError,
        MediaTooLargeError,
        MmprojMismatchError,
        MtmdError,
        UnsupportedMediaError,
    )
    from .messages import has_media, load_media, prepare_chat, prepare_messages, split_media
    from .projector import MtmdProjector


__all__ = [
    "DEFAULT_MARKER", "ChunkType", "InvalidMmprojError", "MediaCountError", "MediaDecodeError", "MediaTooLargeError",
    "MmprojMismatchError", "MtmdBitmap", "MtmdContext", "MtmdError", "MtmdInputChunk", "MtmdInputChunks",
    "MtmdInputText", "MtmdParams", "MtmdProjector", "UnsupportedMediaError", "capabilities", "describe", "has_media",
    "load_media", "prepare_chat", "prepare_messages", "split_media",
]


def describe(mmproj_path: str | os.PathLike[str]) -> str:
    """One line for `llamaplug info --mmproj FILE`: what the projector can take."""
    from .context import capabilities

    vision, audio = capabilities(mmproj_path)
    return f"vision: {'yes' if vision else 'no'}, audio: {'yes' if audio else 'no'}"


@hookimpl
def llamaplug_open_projector(path: Path, model: LlamaModel, params: LlamaParams) -> MtmdProjector:
    """Every projector file is libmtmd's: one this plugin cannot open is an error naming it, not a pass."""
    from .context import MtmdContext, MtmdParams
    from .projector import MtmdProjector

    return MtmdProjector(MtmdContext(path, model, MtmdParams(n_threads=params.n_threads or 0)))


@hookimpl
def llamaplug_describe_projector(path: Path) -> str:
    return describe(path)
