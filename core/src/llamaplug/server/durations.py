"""Durations as Ollama's `keep_alive` takes them: seconds ("300", 300, -1) or Go's units ("5m", "1h30m", "250ms")."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_WHOLE = re.compile(r"-?(?:\d+(?:\.\d+)?(?:ms|h|m|s))+")


def seconds(value: float | int | str) -> float:
    """`value` in seconds (negative: forever, as Ollama); ValueError if it is no duration."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    if not _WHOLE.fullmatch(text):
        raise ValueError(f"{value!r} is not a duration (seconds, or as \"5m\", \"1h30m\", \"-1\")")
    total = sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
    return -total if text.startswith("-") else total
