"""llamaplug-mtmd: images and audio in the same token stream as text (llama.cpp's libmtmd).

    mtmd = MtmdContext(mmproj_path, model, MtmdParams(n_threads=4))
    chunks = mtmd.tokenize(f"What is this? {mtmd.marker}", [MtmdBitmap.from_file("cat.png")])
    n_past = chunks.eval(llama_context, n_past=0)     # then sample as usual

Registered under the ``llamaplug`` entry-point group as ``mtmd`` (listed by `llamaplug info`;
`llamaplug info --mmproj FILE` says what a projector can take).
"""

from __future__ import annotations

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

__all__ = [
    "DEFAULT_MARKER", "ChunkType", "InvalidMmprojError", "MediaCountError", "MediaDecodeError", "MediaTooLargeError",
    "MmprojMismatchError", "MtmdBitmap", "MtmdContext", "MtmdError", "MtmdInputChunk", "MtmdInputChunks",
    "MtmdInputText", "MtmdParams", "UnsupportedMediaError", "capabilities", "describe", "has_media", "load_media",
    "prepare_chat", "prepare_messages", "split_media",
]


def describe(mmproj_path) -> str:
    """One line for `llamaplug info --mmproj FILE`: what the projector can take."""
    vision, audio = capabilities(mmproj_path)
    return f"vision: {'yes' if vision else 'no'}, audio: {'yes' if audio else 'no'}"
