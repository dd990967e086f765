"""OpenAI-style chat messages with image and audio parts -> (messages of text with media markers, media).

Pure conversion, as llama.cpp's server does it (tools/server, `oaicompat_content_load_media` and
common/chat.cpp's `concat_content_parts`): every `image_url` / `input_audio` part becomes the
media marker, text parts are joined with newlines (none next to a marker), and the media are
returned in order, to become bitmaps once an `MtmdContext` is at hand (`load_media`).

    {"type": "image_url", "image_url": {"url": "data:image/png;base64,..." | "file:///abs/path.png"}}
    {"type": "input_audio", "input_audio": {"data": "<base64>", "format": "wav"}}
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from llamaplug.errors import InvalidParameterError

from .errors import MediaDecodeError, UnsupportedMediaError


@dataclass(frozen=True)
class MediaRef:
    """One media part of the messages: its kind ("image" or "audio"), where it was, and its bytes."""

    kind: str
    where: str  # messages[i].content[j], for error messages
    data: bytes


def _decode_base64(text: str, where: str) -> bytes:
    try:
        data = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise MediaDecodeError(f"{where}: not valid base64") from None
    if not data:
        raise MediaDecodeError(f"{where}: empty media")
    return data


def _load_url(url: str, where: str, media_root: str | os.PathLike[str] | None) -> bytes:
    if not isinstance(url, str) or not url:
        raise InvalidParameterError(f"{where}: no url", field="messages")
    if url.startswith("data:"):
        head, sep, payload = url.partition(",")
        if not sep:
            raise MediaDecodeError(f"{where}: a data: URL without ',' and a payload")
        if not head.startswith(("data:image/", "data:audio/")):
            raise UnsupportedMediaError(f"{where}: {head[:40]!r}: only data:image/... and data:audio/... are taken")
        if not head.endswith(";base64"):
            raise MediaDecodeError(f"{where}: the data: URL must be base64 encoded (data:...;base64,...)")
        return _decode_base64(payload, where)
    if url.startswith("file://"):
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise UnsupportedMediaError(f"{where}: file URL of another host ({parsed.netloc})")
        path = Path(unquote(parsed.path))
        if media_root is not None:
            root = Path(media_root).resolve()
            if not path.resolve().is_relative_to(root):
                raise UnsupportedMediaError(f"{where}: {path} is outside the allowed media folder {root}")
        try:
            return path.read_bytes()
        except OSError as exc:
            raise MediaDecodeError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    if url.startswith(("http://", "https://")):
        raise UnsupportedMediaError(f"{where}: remote URLs are not fetched; pass the bytes as a data: URL")
    return _decode_base64(url, where)  # as llama.cpp's server: a bare base64 string


def split_media(messages: Sequence[dict[str, Any]], marker: str, *,
                media_root: str | os.PathLike[str] | None = None) -> tuple[list[dict[str, Any]], list[MediaRef]]:
    """The messages with string contents (media parts replaced by `marker`), and the media in order.

    `media_root`, when given, is the only folder file:// URLs may point into (servers should set it).
    """
    out: list[dict[str, Any]] = []
    media: list[MediaRef] = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        text, last_was_marker = "", False
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                piece = part.get("text", "")
                if not isinstance(piece, str):
                    raise InvalidParameterError(f"{where}.text is not a string", field="messages")
                if text and not last_was_marker:
                    text += "\n"
                text += piece
                last_was_marker = False
            elif kind == "image_url":
                spec = part.get("image_url")
                url = spec.get("url") if isinstance(spec, dict) else spec
                media.append(MediaRef("image", where, _load_url(url, where, media_root)))
                text += marker
                last_was_marker = True
            elif kind == "input_audio":
                spec = part.get("input_audio")
                if not isinstance(spec, dict):
                    raise InvalidParameterError(f"{where}.input_audio must be an object with 'data'", field="messages")
                url = spec.get("data", spec.get("url"))
                media.append(MediaRef("audio", where, _load_url(url, where, media_root)))
                text += marker
                last_was_marker = True
            else:
                raise InvalidParameterError(f"{where}: unsupported content part type {kind!r} (text, image_url and "
                                            "input_audio are)", field="messages")
        out.append({**message, "content": text})
    return out, media


def has_media(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether any message has an image or audio part (what decides that the plugin is needed)."""
    return any(isinstance(part, dict) and part.get("type") in ("image_url", "input_audio")
               for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
               for part in m["content"])


def load_media(media: Sequence[MediaRef], ctx: Any) -> list[Any]:
    """MtmdBitmaps of `media` for the MtmdContext `ctx` (audio is resampled to its rate)."""
    from .context import MtmdBitmap

    bitmaps = []
    for ref in media:
        try:
            bitmap = MtmdBitmap.from_bytes(ref.data, ctx, _name=ref.where)
        except Exception:
            for b in bitmaps:
                b.close()
            raise
        if (ref.kind == "audio") != bitmap.is_audio:
            bitmap.close()
            for b in bitmaps:
                b.close()
            got = "audio" if ref.kind == "image" else "an image"
            raise MediaDecodeError(f"{ref.where}: an {ref.kind} part whose data is {got}")
        bitmaps.append(bitmap)
    return bitmaps


def prepare_messages(messages: Sequence[dict[str, Any]], ctx: Any, *,
                     media_root: str | os.PathLike[str] | None = None) -> tuple[list[dict[str, Any]], list[Any]]:
    """`split_media` with `ctx.marker`, then `load_media`: what Llama's chat path needs before its template."""
    flat, media = split_media(messages, ctx.marker, media_root=media_root)
    return flat, load_media(media, ctx)


def prepare_chat(ctx: Any, messages: Sequence[dict[str, Any]], render: Any, *,
                 media_root: str | os.PathLike[str] | None = None) -> tuple[Any, Any]:
    """The whole multimodal chat prompt for `Llama`: (chunks, what `render` returned besides the text).

    `render(flat_messages) -> (prompt_text, extra)` is the caller's chat-template step (llamaplug's
    `render_prompt`); the prompt is tokenised as `render` + `model.tokenize(prompt, add_bos, special=True)`
    would, with each media marker replaced by the media's tokens. Evaluate with
    `chunks.eval(llama_context, n_past, seq_id)` where the text path would decode the prompt tokens.
    """
    flat, media = split_media(messages, ctx.marker, media_root=media_root)
    prompt, extra = render(flat)
    bitmaps = load_media(media, ctx)
    try:
        chunks = ctx.tokenize(prompt, bitmaps, add_special=ctx.model.add_bos, parse_special=True)
    finally:
        for bitmap in bitmaps:
            bitmap.close()
    return chunks, extra
