"""llama.cpp's log callback, routed into Python logging (logger "llamaplug.native").

Quiet by default: only errors pass unless LLAMAPLUG_LOG (debug, info, warning,
error, none) or LlamaParams.log_level raises it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..raw import ffi, lib
from . import _callback_errors

log = logging.getLogger("llamaplug.native")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "none": logging.CRITICAL + 10}
# ggml_log_level -> logging level; CONT (5) continues the previous message.
_GGML = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_CONT = 5

_state = {"level": logging.INFO, "pending": ""}
_threshold = [logging.ERROR]
# Whether a level was chosen (explicitly, or from LLAMAPLUG_LOG at install): install() keeps it.
_level_chosen = [False]


def set_level(name: str | None) -> None:
    """Let native messages of at least this level through ("debug" ... "none")."""
    level = _LEVELS.get((name or os.environ.get("LLAMAPLUG_LOG") or "error").lower(), logging.ERROR)
    _threshold[0] = level
    if name:
        _level_chosen[0] = True
    if log.level == logging.NOTSET or log.level > level:
        log.setLevel(level)
    _filter_in_c()


# logging level -> the least ggml level (1 debug, 2 info, 3 warn, 4 error, 6 none) the C filter lets through
_C_LEVEL = {logging.DEBUG: 1, logging.INFO: 2, logging.WARNING: 3, logging.ERROR: 4}


def _filter_in_c() -> None:
    """Tell the C filter in front of the callback what this module would drop anyway: what the threshold drops,
    unless a capture (warnings and errors) or a listener (everything) wants it."""
    least = _C_LEVEL.get(_threshold[0], 6)
    if _captures:
        least = min(least, 3)
    if _listeners:
        least = 1
    lib.llamaplug_log_set_min(least)


_captures: list[list[str]] = []
_captures_lock = threading.Lock()
_listeners: list[Callable[[int, str], None]] = []

# llama.cpp's error lines for a decode the abort callback stopped (ggml's status 1 is ABORTED, llama_decode's 2):
# that abort is always asked for here (Ctrl-C, Llama.cancel, an engine closing) and its caller is told (a
# DecodeError with code 2, a KeyboardInterrupt), so they are debug lines, not errors on the terminal.
_ABORTED = ("failed with error 1\n", "compute status: 1\n", "failed to decode, ret = 2\n")


@contextlib.contextmanager
def capture_errors() -> Iterator[list[str]]:
    """Collect native warning and error lines emitted inside the block (to explain a NULL return)."""
    lines: list[str] = []
    with _captures_lock:
        _captures.append(lines)
    _filter_in_c()
    try:
        yield lines
    finally:
        # By identity: list.remove compares by value, so the capture of another thread (two models' engines decode
        # at once) holding the same lines was taken, and this one's removal then raised ValueError, failing the step.
        with _captures_lock:
            del _captures[next(i for i, held in enumerate(_captures) if held is lines)]
        _filter_in_c()


@contextlib.contextmanager
def listen(fn: Callable[[int, str], None]) -> Iterator[None]:
    """Call fn(logging level, text) for every native message inside the block, whatever the threshold.

    For callers that read llama.cpp's progress lines (quantize's per-tensor lines are INFO, dropped
    by the default threshold). `text` is one llama_log call's text, newline included when it has one.
    """
    _listeners.append(fn)
    _filter_in_c()
    try:
        yield
    finally:
        _listeners.remove(fn)
        _filter_in_c()


_silent = [0]


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Log no warning or error of llama.cpp's inside the block (captures and listeners still get them): for a
    native call whose failure a later call repeats and reports (the fit before a load)."""
    _silent[0] += 1
    try:
        yield
    finally:
        _silent[0] -= 1


@ffi.def_extern(onerror=_callback_errors.store)
def _llamaplug_log_cb(level, text, user_data):  # noqa: ARG001 - C signature
    py_level = _state["level"] if level == _CONT else _GGML.get(level, logging.INFO)
    if py_level == logging.ERROR and level != _CONT and ffi.string(text).decode("utf-8", "replace").endswith(_ABORTED):
        py_level = logging.DEBUG
    if _listeners:
        said = ffi.string(text).decode("utf-8", "replace")
        for fn in _listeners:
            fn(py_level, said)
    if _captures and py_level >= logging.WARNING:
        message = ffi.string(text).decode("utf-8", "replace").strip()
        if message:
            for lines in _captures:
                lines.append(message)
    # Every message sets the level its continuations inherit, the dropped ones too: else the dots of a later
    # load's progress (CONT) inherited the last error that passed and were printed after a failed load.
    _state["level"] = py_level
    if py_level < _threshold[0] or (_silent[0] and py_level >= logging.WARNING):
        return
    chunk = _state["pending"] + ffi.string(text).decode("utf-8", "replace")
    *lines, _state["pending"] = chunk.split("\n")
    for line in lines:
        if line:
            log.log(py_level, "%s", line)


def c_callback() -> Any:
    """This module's C log callback (a ggml_log_callback), for native libraries that log through their own setter."""
    return lib.llamaplug_log_filtered


def c_sink() -> Any:
    """A C log callback that drops every line: for native destructors that run after Python is gone."""
    return lib.llamaplug_log_discard


def install() -> None:
    if not _level_chosen[0]:
        set_level(None)  # LLAMAPLUG_LOG; a level set before (LlamaParams.log_level) stays
        _level_chosen[0] = True
    _filter_in_c()
    lib.llama_log_set(lib.llamaplug_log_filtered, ffi.NULL)
    atexit.register(_uninstall)


def _uninstall() -> None:
    # Native destructors may log after Python is gone; give them a C sink.
    lib.llama_log_set(lib.llamaplug_log_discard, ffi.NULL)
