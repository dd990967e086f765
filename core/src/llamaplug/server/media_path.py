"""`file://` URLs in a request's media, as llama-server reads them (its --media-path): refused unless the server
was given a folder, then read from inside that folder only, and put in the body as the file's bytes (base64)
before any route runs.

Why here, in the body guard (middleware.JsonBody), and not in the chat layer: the library's chat path (`Llama`,
the mtmd plugin) reads any local file a `file://` part names, which is what a program's own caller means; a
server's clients must not reach the server's disk that way. Every API family's media reaches the projector
through the request body, each in its own shape, so reading them here, once, means no route hands the chat layer
(or /v1/embeddings' projector prompt) a `file://` URL, and an error names the request's own field
("messages[0].content[1].image_url.url"). Where a media URL may stand:

- OpenAI content parts {"type": "image_url" | "input_audio" | "input_video" | "video_url", TYPE: {"url" | "data":
  URL} or URL} (chat, Responses' chat-shaped input, /v1/embeddings' and /embeddings' content);
- Anthropic's {"type": "image", "source": {"type": "url", "url": URL}};
- Responses' {"type": "input_image", "image_url": URL};
- Ollama's "images": [URL, ...] (its /api/chat messages and /api/generate);
- llama-server's prompt object, "multimodal_data": URL or [URL, ...].

The path rules are llama-server's (tools/server/server-common.cpp `handle_media`, common.cpp
`fs_validate_filename(path, true)`): the path is what follows "file://", as written (no %-decoding), always taken
inside the folder (leading slashes too: file:///x.png is DIR/x.png, as llama-server joins DIR and the path), with no
"..", no control or reserved characters (: * ? " < > |), no leading or trailing space, no trailing ".". Beyond
llama-server's: the real path (symlinks resolved) must stay inside the folder's real path, so a symlink in the
folder that points out is refused, with the same words whether its target exists or not; and only a regular file
is read (a FIFO would block, a device never ends).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from ..errors import InvalidParameterError
from .api_error import BadRequestError
from .request_body import OFF_LOOP

PREFIX = "file://"
# Paths whose bodies are no request to this server's APIs: /cors-proxy forwards its body to another server as it is
NOT_MEDIA = frozenset({"/cors-proxy"})
# OpenAI's media part types, whose value (or its "url" / "data") is a media URL
MEDIA_PARTS = ("image_url", "input_audio", "input_video", "video_url")
# A JSON string may spell a letter of "file:" as a \u escape (\u0066ile:), and only that way: a body with neither
# "file:" nor one of these escapes names no file (most bodies with escaped non-ASCII text are spared a parse)
_ESCAPED = re.compile(rb"\\u00(?:6[569cC]|3[aA])")
_RESERVED = frozenset(':*?"<>|\ufeff\ufffd\uff0e\u2215\u2216\x7f')


def media_dir(path: str | os.PathLike[str] | None) -> Path | None:
    """The real path of a --media-path folder (None: file:// URLs refused); InvalidParameterError when it is no
    folder."""
    if path is None:
        return None
    if not os.path.isdir(path):
        raise InvalidParameterError(f"media_path: not a directory: {path}", field="media_path")
    return Path(os.path.realpath(path))


async def local_media(body: bytes, folder: Path | None) -> bytes:
    """`body` with every media `file://` URL replaced by the file's bytes in base64 (read from inside `folder`);
    BadRequestError naming the field when one is refused. A body that is no JSON, or names no file, is given back
    as it is."""
    if b"file:" not in body and not _ESCAPED.search(body):
        return body
    if len(body) > OFF_LOOP:
        return await asyncio.to_thread(_localized, body, folder)
    return _localized(body, folder)


def _localized(body: bytes, folder: Path | None) -> bytes:
    try:
        value = json.loads(body)  # the parser the routes read the body with: they see what was checked here
    except ValueError:  # no JSON: the route's own parse refuses it
        return body
    except RecursionError:  # (not passed on unchecked: a route's parse, with more stack free, might read it)
        raise BadRequestError("the body is nested too deeply to read", param="body") from None
    found = list(_file_urls(value))
    if not found:
        return body
    for holder, key, where in found:
        holder[key] = base64.b64encode(read(holder[key], folder, where)).decode("ascii")
    try:
        return json.dumps(value).encode()
    except RecursionError:
        raise BadRequestError("the body is nested too deeply to read", param="body") from None


def read(url: str, folder: Path | None, where: str) -> bytes:
    """The bytes of the file `url` (file://PATH) names inside `folder`, by llama-server's rules (the module's
    docstring); BadRequestError naming `where` for a refused or unreadable one."""
    if folder is None:
        raise BadRequestError(f"{where}: file:// URLs are not allowed unless the server is started with "
                              "--media-path DIR (llamaplug serve --media-path)", param=where)
    path = url[len(PREFIX):]
    not_allowed = BadRequestError(f"{where}: file path is not allowed: {path!r} (a path inside --media-path, "
                                  "without '..')", param=where)
    if not _valid_name(path):
        raise not_allowed
    # realpath resolves every symlink, a dangling one too: a link out is refused whether its target exists or not
    real = os.path.realpath(os.path.join(folder, path.lstrip("/")))
    if os.path.commonpath((real, folder)) != str(folder) or real == str(folder):
        raise not_allowed
    try:
        # O_NOFOLLOW: a symlink put in place of the checked path since is not followed; O_NONBLOCK: a FIFO does not
        # hold the worker until something writes to it (it is then refused as no regular file)
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                with open(fd, "rb", closefd=False) as file:
                    return file.read()
        except OSError:
            pass
        finally:
            os.close(fd)
    raise BadRequestError(f"{where}: file does not exist or cannot be opened: {path!r}", param=where)


def _valid_name(path: str) -> bool:
    """common.cpp's fs_validate_filename(path, allow_subdirs=true), for a path inside the media folder."""
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate (request_body refuses those in the body already)
        return False
    if not 0 < size <= 255:
        return False
    if any(c < " " or "\x80" <= c <= "\x9f" or c in _RESERVED for c in path):
        return False
    return not (path[0] == " " or path[-1] in " ." or ".." in path or path == ".")


def _file_urls(value: Any) -> list[tuple[Any, Any, str]]:
    """(holder, key, where) of every media URL in `value` that is a file:// URL: holder[key] is the URL, `where`
    the request's field."""
    found: list[tuple[Any, Any, str]] = []

    def check(holder: Any, key: Any, where: str) -> None:
        url = holder[key]
        if isinstance(url, str) and url.startswith(PREFIX):
            found.append((holder, key, where))

    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, at = stack.pop()
        # (children pushed last first: the URLs in the body's order, the first one's error answered)
        if isinstance(item, list):
            stack.extend(reversed([(sub, f"{at}[{i}]") for i, sub in enumerate(item)]))
            continue
        if not isinstance(item, dict):
            continue
        dot = f"{at}." if at else ""
        kind = item.get("type")
        if kind in MEDIA_PARTS and kind in item:
            spec = item[kind]
            if isinstance(spec, dict):
                for key in ("url", "data"):
                    if key in spec:
                        check(spec, key, f"{dot}{kind}.{key}")
            else:
                check(item, kind, f"{dot}{kind}")
        elif kind == "image" and isinstance(item.get("source"), dict) and "url" in item["source"]:
            check(item["source"], "url", f"{dot}source.url")
        elif kind == "input_image" and "image_url" in item:
            check(item, "image_url", f"{dot}image_url")
        for key in ("images", "multimodal_data"):
            listed = item.get(key)
            if isinstance(listed, list):
                for i, entry in enumerate(listed):
                    if isinstance(entry, str):
                        check(listed, i, f"{dot}{key}[{i}]")
            elif key == "multimodal_data" and isinstance(listed, str):
                check(item, key, f"{dot}{key}")
        stack.extend(reversed([(sub, f"{dot}{key}") for key, sub in item.items() if isinstance(sub, (dict, list))]))
    return found
