"""The responses /v1/responses keeps (`store`, default true as OpenAI's), for `previous_response_id` and
GET/DELETE /v1/responses/{id}: one SQLite file (the standard library's sqlite3), so they survive a restart.

Each row is a response object and its input items (the whole conversation it answered: the previous response's
input and output items, then its own input), owned by the hash of the API key that made it ("" without keys):
a key never reads, chains on or deletes another's. Rows older than `max_age` are gone, and the oldest go first
when the rows' JSON passes `max_bytes`. The file is opened at the first use, so a server nobody asks for
responses creates none.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from .api_error import BadRequestError, ServerFaultError
from .responses.schemas import InputItem, MessageItem, ResponsesRequest

DEFAULT_MAX_AGE = 30 * 86400.0  # seconds: OpenAI keeps a stored response 30 days
DEFAULT_MAX_BYTES = 256 * 2**20  # of the rows' JSON: ~ a few thousand long conversations

_INPUT: TypeAdapter[list[Any]] = TypeAdapter(list[InputItem])
_SCHEMA = """CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL, size INTEGER NOT NULL,
    response TEXT NOT NULL, items TEXT NOT NULL)"""


def default_path() -> Path:
    """The server's file of kept responses: $XDG_DATA_HOME/llamaplug/responses.sqlite3 (~/.local/share/...)."""
    root = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(root) / "llamaplug" / "responses.sqlite3"


def owner_of(api_key: str | None) -> str:
    """Who owns what a request stores: a hash of its API key (the key itself is never written), "" without one."""
    return "" if api_key is None else hashlib.sha256(api_key.encode()).hexdigest()


@dataclass
class Kept:
    """A kept response: the response object and its input items (JSON, as the API returns them)."""

    response: dict[str, Any]
    items: list[dict[str, Any]]


class ResponseStore:
    """Kept responses in the SQLite file `path` (":memory:": this process's only), bounded by age and size."""

    def __init__(self, path: str | os.PathLike[str] = ":memory:", max_age: float = DEFAULT_MAX_AGE,
                 max_bytes: int = DEFAULT_MAX_BYTES):
        self.path, self.max_bytes = str(path), max_bytes
        self.max_age = math.inf if max_age < 0 else max_age  # negative: forever, as the other durations
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # one connection, used from the event loop and worker threads

    def put(self, owner: str, response: dict[str, Any], items: list[dict[str, Any]]) -> None:
        text, listed = json.dumps(response, ensure_ascii=False), json.dumps(items, ensure_ascii=False)
        with self._lock, self._open() as db:
            db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                       (response["id"], owner, time.time(), len(text) + len(listed), text, listed))
            self._prune(db)

    def get(self, owner: str, ident: str) -> Kept | None:
        """The response `ident` if `owner` kept it and it has not expired."""
        with self._lock, self._open() as db:
            row = db.execute("SELECT response, items FROM responses WHERE id = ? AND owner = ? AND created >= ?",
                             (ident, owner, time.time() - self.max_age)).fetchone()
        return None if row is None else Kept(json.loads(row[0]), json.loads(row[1]))

    def delete(self, owner: str, ident: str) -> bool:
        """Forget `owner`'s response `ident`; False if there was none."""
        with self._lock, self._open() as db:
            return db.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (ident, owner)).rowcount > 0

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _open(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
            if self.path != ":memory:":
                db.execute("PRAGMA journal_mode=WAL")  # servers sharing the file do not block each other's reads
                db.execute("PRAGMA synchronous=NORMAL")  # WAL's: no fsync per response on the event loop
            db.execute(_SCHEMA)
            db.execute("CREATE INDEX IF NOT EXISTS by_created ON responses (created)")
            db.commit()
        except (OSError, sqlite3.Error) as exc:
            raise ServerFaultError(f"cannot open the responses store {self.path}: {exc} (--responses-db PATH "
                                   "to keep them elsewhere, --no-responses-store to keep none)") from None
        self._db = db
        return db

    def _prune(self, db: sqlite3.Connection) -> None:
        db.execute("DELETE FROM responses WHERE created < ?", (time.time() - self.max_age,))
        # the newest rows whose sizes add up to max_bytes stay; the sum is a plain scan, the window query a sort,
        # so the sort runs only when the cap is passed
        if db.execute("SELECT total(size) FROM responses").fetchone()[0] <= self.max_bytes:
            return
        db.execute("DELETE FROM responses WHERE id IN (SELECT id FROM (SELECT id, SUM(size) OVER "
                   "(ORDER BY created DESC, id) AS kept FROM responses) WHERE kept > ?)", (self.max_bytes,))


def given_items(body: ResponsesRequest) -> list[dict[str, Any]]:
    """A request's input as the items GET .../input_items lists: each with an id, a message's text as a part."""
    given: list[Any] = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    out = []
    for item in given:
        fields = item.model_dump(mode="json", by_alias=True, exclude_none=True)
        if isinstance(item, MessageItem) and isinstance(item.content, str):
            part = "output_text" if item.role == "assistant" else "input_text"
            fields["content"] = [{"type": part, "text": item.content}]
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}[fields["type"]]
        out.append({"id": f"{prefix}_{uuid.uuid4().hex}", **fields})
    return out


def chained(store: ResponseStore | None, owner: str, body: ResponsesRequest) -> tuple[ResponsesRequest, list[dict]]:
    """`body` with the conversation of its previous_response_id before its input (OpenAI's: that response's input
    items, then its output items), and the items it answers. An id `owner` did not keep: a 400 as OpenAI's."""
    items = given_items(body)
    if body.previous_response_id is None:
        return body, items
    if store is None:
        raise BadRequestError("previous_response_id: this server keeps no responses (--no-responses-store); send "
                              "the whole conversation as input", param="previous_response_id",
                              code="unsupported_parameter")
    kept = store.get(owner, body.previous_response_id)
    if kept is None:
        raise BadRequestError(f"Previous response with id '{body.previous_response_id}' not found.",
                              param="previous_response_id", code="previous_response_not_found")
    items = kept.items + kept.response["output"] + items
    # reasoning items stay listed, but are not sent back (as the chat path drops an earlier turn's thinking)
    history = _INPUT.validate_python([h for i in items if i["type"] != "reasoning" for h in _as_input(i)])
    return body.model_copy(update={"input": history}), items


def _as_input(item: dict[str, Any]) -> list[dict[str, Any]]:
    """A kept item as the next turn's input: an MCP call (server/mcp/responses.py) as the model saw it, a call to
    `<server>_<tool>` and its result; the tools an MCP server listed, nothing."""
    if item["type"] == "mcp_list_tools":
        return []
    if item["type"] == "mcp_call":
        call_id = item["id"]
        return [{"type": "function_call", "call_id": call_id, "name": f"{item['server_label']}_{item['name']}",
                 "arguments": item["arguments"]},
                {"type": "function_call_output", "call_id": call_id,
                 "output": item["output"] if item.get("output") is not None else item.get("error") or ""}]
    return [item]
