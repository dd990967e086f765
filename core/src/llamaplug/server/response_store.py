"""The responses /v1/responses keeps (`store`, default true as OpenAI's), for `previous_response_id` and
GET/DELETE /v1/responses/{id}: one SQLite file (the standard library's sqlite3), so they survive a restart.

Each row is a response object and its input items (the whole conversation it answered: the previous response's
input and output items, then its own input), owned by the hash of the API key that made it ("" without keys):
a key never reads, chains on or deletes another's. Rows older than `max_age` are gone, and the oldest go first
when the rows' JSON passes `max_bytes`. The file is opened at the first use, so a server nobody asks for
responses creates none.

Conversations (POST /v1/conversations, a response's `conversation`) are kept in the same file under the same
rules: a conversation and its items, in order, owned by a key; one not used for `max_age` is gone, and the least
recently used go first when their items' JSON passes `max_bytes`.
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

from .api_error import BadRequestError, NotFoundError, ServerFaultError
from .responses.schemas import InputItem, MessageItem, ResponsesRequest

DEFAULT_MAX_AGE = 30 * 86400.0  # seconds: OpenAI keeps a stored response 30 days
DEFAULT_MAX_BYTES = 256 * 2**20  # of the rows' JSON: ~ a few thousand long conversations

_INPUT: TypeAdapter[list[Any]] = TypeAdapter(list[InputItem])
_SCHEMA = """CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL, size INTEGER NOT NULL,
    response TEXT NOT NULL, items TEXT NOT NULL)"""
_CONVERSATIONS = ("""CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL, used REAL NOT NULL, metadata TEXT NOT NULL)""",
                  """CREATE TABLE IF NOT EXISTS conversation_items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, conversation TEXT NOT NULL, id TEXT NOT NULL, size INTEGER NOT NULL,
    item TEXT NOT NULL)""",
                  "CREATE INDEX IF NOT EXISTS items_by_conversation ON conversation_items (conversation, seq)")


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

    def create_conversation(self, owner: str, items: list[dict[str, Any]], metadata: dict[str, str]
                            ) -> dict[str, Any]:
        """A new conversation of `owner`'s with `items` (given ids), as the API returns it."""
        now, ident = time.time(), f"conv_{uuid.uuid4().hex}"
        with self._lock, self._open() as db:
            db.execute("INSERT INTO conversations VALUES (?, ?, ?, ?, ?)",
                       (ident, owner, now, now, json.dumps(metadata, ensure_ascii=False)))
            self._add(db, ident, items)
        return {"id": ident, "created_at": int(now), "metadata": metadata}

    def conversation(self, owner: str, ident: str, metadata: dict[str, str] | None = None) -> dict[str, Any] | None:
        """`owner`'s conversation `ident` (with new `metadata` if given), None if there is none."""
        with self._lock, self._open() as db:
            row = self._live(db, owner, ident)
            if row is not None and metadata is not None:
                db.execute("UPDATE conversations SET metadata = ? WHERE id = ?",
                           (json.dumps(metadata, ensure_ascii=False), ident))
                row = row[0], json.dumps(metadata)
        return None if row is None else {"id": ident, "created_at": int(row[0]), "metadata": json.loads(row[1])}

    def delete_conversation(self, owner: str, ident: str) -> bool:
        with self._lock, self._open() as db:
            if db.execute("DELETE FROM conversations WHERE id = ? AND owner = ?", (ident, owner)).rowcount == 0:
                return False
            db.execute("DELETE FROM conversation_items WHERE conversation = ?", (ident,))
            return True

    def conversation_items(self, owner: str, ident: str) -> list[dict[str, Any]] | None:
        """The items of `owner`'s conversation `ident`, oldest first; None if there is no such conversation."""
        with self._lock, self._open() as db:
            if self._live(db, owner, ident) is None:
                return None
            rows = db.execute("SELECT item FROM conversation_items WHERE conversation = ? ORDER BY seq",
                              (ident,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def add_items(self, owner: str, ident: str, items: list[dict[str, Any]]) -> bool:
        """`items` (given ids) after the others of `owner`'s conversation `ident`; False if there is none."""
        with self._lock, self._open() as db:
            if self._live(db, owner, ident) is None:
                return False
            self._add(db, ident, items)
            return True

    def delete_item(self, owner: str, ident: str, item_id: str) -> bool:
        with self._lock, self._open() as db:
            if self._live(db, owner, ident) is None:
                return False
            return db.execute("DELETE FROM conversation_items WHERE conversation = ? AND id = ?",
                              (ident, item_id)).rowcount > 0

    def _live(self, db: sqlite3.Connection, owner: str, ident: str) -> tuple[float, str] | None:
        """(created, metadata) of `owner`'s conversation `ident` if it is not expired; marks it used."""
        now = time.time()
        row = db.execute("SELECT created, metadata FROM conversations WHERE id = ? AND owner = ? AND used >= ?",
                         (ident, owner, now - self.max_age)).fetchone()
        if row is not None:
            db.execute("UPDATE conversations SET used = ? WHERE id = ?", (now, ident))
        return row

    def _add(self, db: sqlite3.Connection, ident: str, items: list[dict[str, Any]]) -> None:
        for item in items:
            text = json.dumps(item, ensure_ascii=False)
            db.execute("INSERT INTO conversation_items (conversation, id, size, item) VALUES (?, ?, ?, ?)",
                       (ident, item["id"], len(text), text))
        db.execute("UPDATE conversations SET used = ? WHERE id = ?", (time.time(), ident))
        self._prune_conversations(db)

    def _prune_conversations(self, db: sqlite3.Connection) -> None:
        db.execute("DELETE FROM conversations WHERE used < ?", (time.time() - self.max_age,))
        db.execute("DELETE FROM conversation_items WHERE conversation NOT IN (SELECT id FROM conversations)")
        if db.execute("SELECT total(size) FROM conversation_items").fetchone()[0] <= self.max_bytes:
            return
        db.execute("DELETE FROM conversations WHERE id IN (SELECT id FROM (SELECT c.id, SUM(s.size) OVER "
                   "(ORDER BY c.used DESC, c.id) AS kept FROM conversations c JOIN (SELECT conversation, "
                   "total(size) AS size FROM conversation_items GROUP BY conversation) s ON s.conversation = c.id) "
                   "WHERE kept > ?)", (self.max_bytes,))
        db.execute("DELETE FROM conversation_items WHERE conversation NOT IN (SELECT id FROM conversations)")

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
            for statement in _CONVERSATIONS:
                db.execute(statement)
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
    return as_items([MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input)


def as_items(given: list[Any]) -> list[dict[str, Any]]:
    """Input items (schemas.InputItem) as they are kept and listed: each with an id, a message's text as a part."""
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
    items, then its output items), or the items of its `conversation`, and the items it answers. An id `owner`
    did not keep: a 400 as OpenAI's (a conversation: a 404)."""
    items = given_items(body)
    if body.conversation is not None:
        return _in_conversation(store, owner, body, items)
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
    return body.model_copy(update={"input": _history(items)}), items


def conversation_id(body: ResponsesRequest) -> str | None:
    given = body.conversation
    return given if isinstance(given, str) or given is None else given.id


def _in_conversation(store: ResponseStore | None, owner: str, body: ResponsesRequest, items: list[dict]
                     ) -> tuple[ResponsesRequest, list[dict]]:
    ident = conversation_id(body)
    if body.previous_response_id is not None:  # OpenAI's: one or the other
        raise BadRequestError("previous_response_id and conversation cannot both be given: a conversation keeps "
                              "its own turns", param="conversation", code="invalid_request_error")
    if store is None:
        raise BadRequestError("conversation: this server keeps no conversations (--no-responses-store); send the "
                              "whole conversation as input", param="conversation", code="unsupported_parameter")
    kept = store.conversation_items(owner, str(ident))
    if kept is None:
        raise NotFoundError(f"Conversation with id '{ident}' not found.", param="conversation")
    return body.model_copy(update={"input": _history(kept + items)}), items


def _history(items: list[dict[str, Any]]) -> list[Any]:
    # reasoning items stay listed, but are not sent back (as the chat path drops an earlier turn's thinking)
    return _INPUT.validate_python([h for i in items if i["type"] != "reasoning" for h in _as_input(i)])


def page(items: list[dict[str, Any]], limit: int, order: str, after: str | None, where: str,
         what: str = "item") -> dict[str, Any]:
    """One of OpenAI's list pages of `items` (oldest first), `after` the id of one of `where`'s `what`s."""
    items = items[::-1] if order == "desc" else items
    if after is not None:
        start = next((i + 1 for i, item in enumerate(items) if item.get("id") == after), None)
        if start is None:
            raise BadRequestError(f"no {what} {after!r} in {where}", param="after")
        items = items[start:]
    data = items[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(items) > limit}


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
