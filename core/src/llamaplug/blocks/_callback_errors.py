"""Exceptions raised inside a cffi ``extern "Python"`` callback, kept until the C call returns.

An exception cannot cross llama.cpp's C frames (a KeyboardInterrupt when a pending SIGINT
handler runs in the log callback, an error in a Python sampler's apply): `store` is the
callbacks' ``onerror`` and keeps it; `raise_stored` raises it (once) after the native call.
"""

from __future__ import annotations

_stored: list[BaseException] = []


def store(exc_type, exc_value, traceback) -> None:  # noqa: ARG001 - cffi's onerror signature
    _stored.append(exc_value if exc_value is not None else exc_type())


def raise_stored() -> None:
    if _stored:
        exc = _stored[0]
        _stored.clear()
        raise exc
