"""The embedding routes' `input` (or /embeddings' `content`) in every shape llama-server takes (its
tokenize_input_prompts, and handle_embeddings_impl's OpenAI content), as prompts for Llama.embed: each a text, a
list of token ids, or a `MediaInput` (text with media, made into the projector's prompt by the route).

- "text", or a list of texts: one prompt each;
- token ids [12, 34, 56], or ids and texts mixed [12, "text", 34]: one prompt (a text in it is tokenized, with the
  model's special tokens only when it comes first, as llama-server's tokenize_mixed);
- a list of such prompts: [[12, 34], "text", ...];
- {"prompt_string": "text"}, or {"content": [{"type": "text", "text": ...}, ...]} (OpenAI's content parts, the
  texts joined with nothing between them, as llama-server joins them): one prompt, alone or in a list;
- with media, on a server with a projector (--mmproj): {"prompt_string": "text <__media__> text",
  "multimodal_data": ["<base64>", ...]} (one media marker per item, in order: the marker is LLAMA_MEDIA_MARKER where
  set, as llama-server reads it, else "<__media__>"), or content parts with {"type": "image_url", "image_url":
  {"url": "data:image/...;base64,..." or bare base64}} and {"type": "input_audio", "input_audio": {"data": ...}}.

Media on a server without a projector, or a malformed one, is a 400 naming the field: "input[0].multimodal_data[0]".
A file:// URL (in a content part or multimodal_data) was read before the route, as llama-server reads it: from the
server's --media-path, or refused without one (media_path.py, in the body guard); one that reaches this module
anyway is refused, never read.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
from typing import Any

from ..errors import BadRequestError
from ..media_path import MEDIA_PARTS
from ..shared import mixed_tokens

DEFAULT_MARKER = "<__media__>"  # libmtmd's default marker, which llama-server uses where LLAMA_MEDIA_MARKER is set


@dataclasses.dataclass(frozen=True)
class MediaInput:
    """One prompt with media: content parts (text and media alternating, never two texts in a row, so that the
    projector's message step joins nothing) and `where` each came from (the request's field, for errors)."""

    parts: list[dict[str, Any]]
    where: list[str]


Prompt = str | list[int] | MediaInput


def embedding_prompts(given: Any, tokenize: Any, multimodal: bool = False, field: str = "input") -> list[Prompt]:
    """The prompts of `given` (the request's `field`); `tokenize(text, add_special)` reads a text of a mixed one.
    `multimodal`: the model has a projector (else media are a 400)."""
    reader = _Reader(tokenize, multimodal)
    if isinstance(given, list) and not _has_ids(given):
        if not given:
            raise BadRequestError(f'"{field}" must not be empty', param=field)
        return [reader.prompt(item, f"{field}[{i}]") for i, item in enumerate(given)]
    return [reader.prompt(given, field)]


def media_marker() -> str:
    """The marker that says where each of multimodal_data's items goes in prompt_string."""
    return os.environ.get("LLAMA_MEDIA_MARKER") or DEFAULT_MARKER


def _has_ids(value: list[Any]) -> bool:
    return any(_is_id(v) for v in value)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass
class _Reader:
    tokenize: Any
    multimodal: bool

    def prompt(self, item: Any, where: str) -> Prompt:
        if isinstance(item, str):
            return item
        if isinstance(item, list):
            if not item or not all(_is_id(v) or isinstance(v, str) for v in item):
                raise BadRequestError(f"{where} must be token ids and texts", param=where)
            if all(_is_id(v) for v in item):
                return list(item)
            return mixed_tokens(item, self.tokenize)
        if isinstance(item, dict):
            if "content" in item:
                return self.content(item["content"], f"{where}.content")
            if "prompt_string" in item and "multimodal_data" in item:
                return self.multimodal_data(item["prompt_string"], item["multimodal_data"], where)
            if "multimodal_data" in item:
                raise BadRequestError(f"{where}.multimodal_data needs a prompt_string beside it", param=where)
            if isinstance(item.get("prompt_string"), (str, list)):
                return self.prompt(item["prompt_string"], f"{where}.prompt_string")
        raise BadRequestError(f"{where} must be a text, token ids, {{\"prompt_string\": ...}} or "
                              "{\"content\": [...]}", param=where)

    def content(self, parts: Any, where: str) -> Prompt:
        """OpenAI's content parts: their texts joined with nothing between them, each media part where it stands."""
        if not isinstance(parts, list):
            raise BadRequestError(f"{where} must be a list of content parts", param=where)
        out: list[dict[str, Any]] = []
        wheres: list[str] = []
        for j, part in enumerate(parts):
            at = f"{where}[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in MEDIA_PARTS:
                self.check_media(kind, at)
                _no_file_url(part, kind, at)
                out.append(part)
                wheres.append(at)
            elif kind == "text" and isinstance(part.get("text"), str):
                _add_text(out, wheres, part["text"], at)
            else:
                raise BadRequestError(f"{at} must be a text part or a media part ({', '.join(MEDIA_PARTS)})",
                                      param=at)
        return _joined(out, wheres)

    def multimodal_data(self, text: Any, data: Any, where: str) -> Prompt:
        """llama-server's prompt object with media: the marker in `text` where each item of `data` goes."""
        if not self.multimodal:
            raise BadRequestError(f"{where}.multimodal_data: this model takes no media (it has no projector: "
                                  "serve --mmproj)", param=f"{where}.multimodal_data")
        if not isinstance(text, str):
            raise BadRequestError(f"{where}.prompt_string must be a text beside multimodal_data",
                                  param=f"{where}.prompt_string")
        items = [data] if isinstance(data, str) else data
        if not isinstance(items, list) or not all(isinstance(d, str) for d in items):
            raise BadRequestError(f"{where}.multimodal_data must be a list of base64 strings",
                                  param=f"{where}.multimodal_data")
        marker = media_marker()
        pieces = text.split(marker)
        if len(pieces) - 1 != len(items):
            raise BadRequestError(f"{where}: prompt_string has {len(pieces) - 1} media marker(s) {marker!r} and "
                                  f"multimodal_data {len(items)} item(s): one marker per item, in order",
                                  param=f"{where}.multimodal_data")
        out: list[dict[str, Any]] = []
        wheres: list[str] = []
        for k, piece in enumerate(pieces):
            _add_text(out, wheres, piece, f"{where}.prompt_string")
            if k < len(items):
                _not_file_url(items[k], f"{where}.multimodal_data[{k}]")
                out.append(_media_part(items[k]))
                wheres.append(f"{where}.multimodal_data[{k}]")
        return _joined(out, wheres)

    def check_media(self, kind: str, where: str) -> None:
        if not self.multimodal:
            raise BadRequestError(f"{where}: {kind} needs a model with a projector (serve --mmproj)", param=where)


def _add_text(out: list[dict[str, Any]], wheres: list[str], text: str, where: str) -> None:
    """A text after the parts so far: joined to a text before it (with nothing between), as llama-server joins."""
    if not text:
        return
    if out and out[-1].get("type") == "text":
        out[-1] = {"type": "text", "text": out[-1]["text"] + text}
    else:
        out.append({"type": "text", "text": text})
        wheres.append(where)


def _joined(parts: list[dict[str, Any]], wheres: list[str]) -> Prompt:
    """A text when no part is media, else the MediaInput."""
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return MediaInput(parts, wheres)


def _no_file_url(part: dict[str, Any], kind: str, where: str) -> None:
    spec = part.get(kind)
    for url in [spec.get("url"), spec.get("data")] if isinstance(spec, dict) else [spec]:
        _not_file_url(url, where)


def _not_file_url(url: Any, where: str) -> None:
    """The projector reads any file a file:// URL names: what the body guard read from --media-path is bytes by
    now, so one still here was not checked against it."""
    if isinstance(url, str) and url.startswith("file:"):
        raise BadRequestError(f"{where}: a file:// URL is read only from the server's --media-path (serve "
                              "--media-path DIR): send the bytes as a data: URL or base64", param=where)


def _media_part(data: str) -> dict[str, Any]:
    """A multimodal_data item (base64 of an image or audio file) as a content part, audio by its first bytes as
    llama.cpp's mtmd-helper tells it (WAV, MP3, FLAC); what does not decode is the projector's to refuse."""
    if data.startswith("data:"):
        kind = "input_audio" if data.startswith("data:audio/") else "image_url"
    else:
        try:
            head = base64.b64decode(data.strip()[:16], validate=True)
        except (binascii.Error, ValueError):
            head = b""
        kind = "input_audio" if _is_audio(head) else "image_url"
    return {"type": kind, kind: {"data": data} if kind == "input_audio" else {"url": data}}


def _is_audio(head: bytes) -> bool:
    return len(head) >= 12 and ((head[:4] == b"RIFF" and head[8:12] == b"WAVE") or head[:3] == b"ID3"
                                or head[:4] == b"fLaC" or (head[0] == 0xFF and (head[1] & 0xE0) == 0xE0))
