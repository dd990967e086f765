"""read_file, write_file and edit_file, as llama-server's (server-tools.cpp), on this host's files."""

from __future__ import annotations

import base64
import os
from typing import Any

from ..api_error import BadRequestError
from .edits import Edit, apply_edits
from .fields import Params

READ_MAX = 16 * 1024  # what read_file returns as text (llama-server's SERVER_TOOL_READ_FILE_MAX_SIZE)
READ_MAX_BASE64 = 32 * 1024 * 1024  # a whole file as base64 (x-resp-type: base64, the web UI's)


def lines(content: bytes) -> list[bytes]:
    """std::getline's lines: split at \\n, no empty last line after a final \\n."""
    parts = content.split(b"\n")
    return parts[:-1] if parts[-1] == b"" else parts


def read_file(params: Params, resp_type: str = "") -> dict[str, Any]:
    path = params.string("path")
    start_line = params.integer("start_line", 1)
    end_line = params.integer("end_line", -1)  # -1: to the end
    append_loc = params.boolean("append_loc")
    full = params.resolve(path)
    try:
        size = os.stat(full).st_size
        if not os.path.isfile(full):
            raise IsADirectoryError(full)
    except OSError:
        return {"error": "cannot stat file: " + path}
    if resp_type == "base64":
        if size > READ_MAX_BASE64:
            return {"error": f"file too large ({size} bytes, max {READ_MAX_BASE64})"}
        content = _read(full)
        if content is None:
            return {"error": "failed to open file: " + path}
        return {"base64": base64.b64encode(content).decode("ascii"), "size_bytes": len(content)}
    if size > READ_MAX and end_line == -1:
        return {"error": f"file too large ({size} bytes, max {READ_MAX}). Use start_line/end_line to read a portion."}
    content = _read(full)
    if content is None:
        return {"error": "failed to open file: " + path}
    out = bytearray()
    for number, line in enumerate(lines(content), 1):
        if number < start_line:
            continue
        if end_line != -1 and number > end_line:
            break
        piece = (f"{number}\u2192".encode() if append_loc else b"") + line + b"\n"
        if len(out) + len(piece) > READ_MAX:
            out += b"[output truncated]"
            break
        out += piece
    return {"plain_text_response": out.decode("utf-8", "replace")}


def _read(full: str) -> bytes | None:
    if not os.path.isfile(full):  # a FIFO or a device would block the thread (llama-server's ifstream waits)
        return None
    try:
        with open(full, "rb") as f:
            return f.read()
    except OSError:
        return None


def _write(full: str, content: bytes) -> bool:
    try:
        parent = os.path.dirname(full)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(full, "wb") as f:
            f.write(content)
        return True
    except OSError:
        return False


def write_file(params: Params) -> dict[str, Any]:
    path, content = params.string("path"), params.string("content")
    data = content.encode("utf-8", "surrogateescape")
    if not _write(params.resolve(path), data):
        return {"error": "failed to write file: " + path}
    return {"result": "file written successfully", "path": path, "bytes": len(data)}


def edit_file(params: Params) -> dict[str, Any]:
    path = params.string("path")
    given = params.given.get("edits")
    if given is None:
        raise BadRequestError("params.edits is required", param="params.edits")
    if not isinstance(given, list) or not given:
        return {"error": '"edits" must be a non-empty array'}
    edits = []
    for i, e in enumerate(given):
        if not isinstance(e, dict):
            raise BadRequestError(f"params.edits.{i} must be an object", param=f"params.edits.{i}")
        texts = []
        for key in ("old_text", "new_text"):
            if not isinstance(e.get(key), str):
                raise BadRequestError(f"params.edits.{i}.{key} must be a string", param=f"params.edits.{i}.{key}")
            texts.append(e[key])
        if not texts[0]:
            return {"error": f"edits[{i}].old_text must not be empty"}
        edits.append(Edit(*texts))
    full = params.resolve(path)
    raw = _read(full)
    if raw is None:
        return {"error": "failed to open file: " + path}
    # surrogateescape: bytes that are not UTF-8 come back out as they were
    original = raw.decode("utf-8", "surrogateescape")
    edited = apply_edits(original, edits, path)
    if isinstance(edited, dict):
        return edited
    if edited == original:
        return {"error": "no changes made: the replacement(s) produced identical content"}
    if not _write(full, edited.encode("utf-8", "surrogateescape")):
        return {"error": "failed to write file: " + path}
    return {"result": "file edited successfully", "path": path, "edits_applied": len(edits)}
