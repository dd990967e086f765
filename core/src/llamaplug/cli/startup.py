"""The garbage collector held off while a command starts (see entry.main), on again once serve's app is built."""

from __future__ import annotations

import gc

# Whether main() holds the collector off until serve's app is built (not where the process had it off already).
_held = False


def started() -> None:
    """The end of serve's start: the collector runs again (see main), and never scans what the start made (the
    modules, the classes, the loaded model: a server's, they live for good)."""
    global _held
    if _held:
        _held = False
        gc.freeze()
        gc.enable()


def hold() -> None:
    """Hold the collector off until `started()` (main, for a serve, where the process had it on)."""
    global _held
    gc.disable()
    _held = True


def release() -> None:
    """The command is done: `started()` has nothing left to turn on."""
    global _held
    _held = False
