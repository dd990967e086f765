"""What `llamaplug serve` writes on stderr: its own lines, the library's log, and llama.cpp's, as text or JSON.

The server's own lines show at every --log level but none: the model loaded, "listening on"
(once the socket listens, saying whether an API key is required), one line per request
(server/access_log.py) and one when it stopped. The library's other loggers follow --log
(default error). llama.cpp's own lines (llamaplug.native: ~140 at info for one model load) pass
only with --verbose, at --log's level; without it only their warnings and errors do, where
--log shows those. uvicorn's loggers go through the same handler (its own access log is off:
ours replaces it). With --log-format json every line is one JSON object: time, level, logger,
message, and a record's fields (a request's method, path, status, duration_ms, client). The lines are
written by a thread of their own (_Behind), so a stderr nobody reads never stalls a request.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import logging
import os
import queue
import socket
import sys
import threading
from typing import Any

log = logging.getLogger("llamaplug.serve")

_NONE = logging.CRITICAL + 10
_OWN = ("llamaplug.serve", "llamaplug.server.access", "llamaplug.speculative")  # (its line: a request's acceptance)
# A LogRecord's own attributes (and uvicorn's color_message): the rest of a record's are its `extra` fields.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime",
                                                                                 "color_message"}


class JsonLines(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(
                timespec="milliseconds"),
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        line.update((k, v) for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_"))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class _Behind(logging.Handler):
    """Writes records to `stream` on a thread of its own: a stderr that is not read (a full pipe, a stalled
    terminal) stalls that thread, never the event loop or a decode thread that logs. At most BACKLOG records
    wait; more are dropped, and how many is said once the writes go on. What waits is written at exit (for
    up to 5 s, unless a drain() found the stream blocked). The thread holds no lock while it writes (no
    handler's: logging.shutdown takes them at exit)."""

    BACKLOG = 10_000

    def __init__(self, stream: Any, formatter: logging.Formatter):
        super().__init__()
        self.stream, self.dropped = stream, 0
        self.setFormatter(formatter)
        self.waiting: queue.Queue[logging.LogRecord | threading.Event | None] = queue.Queue(self.BACKLOG)
        self.thread = threading.Thread(target=self._write, name="llamaplug-log", daemon=True)
        self.thread.start()
        atexit.register(self.finish)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.waiting.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def _write(self) -> None:
        while (record := self.waiting.get()) is not None:
            if isinstance(record, threading.Event):  # drain()'s mark: what came before it is written
                record.set()
                continue
            if self.dropped:
                dropped, self.dropped = self.dropped, 0
                self._line(logging.makeLogRecord({
                    "name": log.name, "levelno": logging.WARNING, "levelname": "WARNING",
                    "msg": "%d log lines dropped: stderr was not read", "args": (dropped,)}))
            self._line(record)

    def _line(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.format(record) + "\n")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a record that cannot be written is reported
            self.handleError(record)

    def drain(self, seconds: float = 2.0) -> None:
        """Wait until what waits now is written (for up to `seconds`: a stderr nobody reads never empties)."""
        written = threading.Event()
        with contextlib.suppress(queue.Full):
            self.waiting.put(written, timeout=seconds)
        self.stuck = not written.wait(seconds)

    stuck = False

    def finish(self, seconds: float = 5.0) -> None:
        if self.stuck:  # the exit waits no longer for a stderr that drain() found blocked
            return
        with contextlib.suppress(queue.Full):
            self.waiting.put(None, timeout=seconds)
        self.thread.join(seconds)


class _Fd:
    """A stream writing straight to a file descriptor: the writer thread, blocked on a full pipe, then holds
    no lock of sys.stderr's (else Python aborts at exit, unable to flush sys.stderr past it)."""

    def __init__(self, fd: int):
        self.fd = fd

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        while data:
            data = data[os.write(self.fd, data):]

    def flush(self) -> None:
        pass


def _stderr() -> Any:
    try:
        sys.stderr.flush()
        return _Fd(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # a stderr with no descriptor (captured, in a test)
        return sys.stderr


def configure(level: str | None, log_format: str, verbose: bool) -> str:
    """Send every log record to stderr as the module says; returns the level for llama.cpp's own lines
    (LlamaParams.log_level)."""
    level = level or ("debug" if verbose else os.environ.get("LLAMAPLUG_LOG") or "error")
    numeric = _NONE if level == "none" else getattr(logging, level.upper())
    formatter = JsonLines() if log_format == "json" else logging.Formatter("%(name)s: %(message)s")
    logging.basicConfig(level=numeric, handlers=[_Behind(_stderr(), formatter)], force=True)  # (main()'s replaced)
    for name in _OWN:  # shown whatever --log says, but none (their probes' lines at debug only)
        logging.getLogger(name).setLevel(numeric if numeric == _NONE else min(numeric, logging.INFO))
    if verbose or numeric >= logging.WARNING:
        return level
    return "warning"  # llama.cpp's info and debug lines only with --verbose


def listening(bound: list[socket.socket], api_key: str | None) -> None:
    """The line saying where the server now listens (after `listen()` on `bound`)."""
    auth = "API key required" if api_key else "no API key: open to whoever reaches it"
    for sock in bound:
        where = address(sock)
        log.info("listening on %s (%s)", where, auth, extra={"address": where, "auth": api_key is not None})


def address(sock: socket.socket) -> str:
    name = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return f"unix://{name}"
    host = f"[{name[0]}]" if sock.family == socket.AF_INET6 else name[0]
    return f"http://{host}:{name[1]}"


def stopped(seconds: float, requests: int) -> None:
    """The last line, written before this returns (uvicorn may end the process by raising the signal again)."""
    log.info("stopped after %.1f s, %d requests served", seconds, requests,
             extra={"uptime_s": round(seconds, 3), "requests": requests})
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _Behind):
            handler.drain()
