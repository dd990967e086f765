"""Which replica a request prefers: a key from its prompt's first characters, placed on a consistent-hash ring.

Requests whose prompts share their first `chars` characters get the same key, so the
same replica, whose slots keep those tokens in their KV cache (`cached_tokens`).
Characters, not tokens: the ingress holds no model; a few hundred characters is the
first hundred-odd tokens, a system prompt's worth. A consistent ring moves only the
keys of a replica that comes or goes, so a restart does not reshuffle every family.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Iterable
from typing import Any

DEFAULT_CHARS = 256
_VIRTUAL_NODES = 64  # points per replica on the ring: an even share of keys for a few replicas


def prompt_text(path: str, body: bytes) -> str | None:
    """The text a completion or chat request starts with (None: not one, or not JSON: any replica will do)."""
    if not path.endswith(("/completions", "/chat/completions")):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if "messages" in data:
        return _messages_text(data["messages"])
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]  # a batch of prompts goes where its first one does
        return first if isinstance(first, str) else json.dumps(prompt if isinstance(first, int) else first)
    return None


def _messages_text(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return None
    parts = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):  # parts: their text, in order
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<{message.get('role', '')}>{content if isinstance(content, str) else ''}")
    return "".join(parts)


def affinity_key(path: str, body: bytes, chars: int = DEFAULT_CHARS) -> str | None:
    """The routing key of a request: a hash of its prompt's first `chars` characters."""
    text = prompt_text(path, body)
    if text is None:
        return None
    return hashlib.blake2b(text[:chars].encode(), digest_size=8).hexdigest()


def _point(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing of keys over names (replica ids)."""

    def __init__(self, names: Iterable[str]):
        self.names = frozenset(names)
        points = sorted((_point(f"{name}#{i}"), name) for name in self.names for i in range(_VIRTUAL_NODES))
        self._points = [p for p, _ in points]
        self._owners = [n for _, n in points]

    def owner(self, key: str) -> str | None:
        """The name holding `key`: the first point clockwise from the key's (None on an empty ring)."""
        if not self._points:
            return None
        at = bisect.bisect(self._points, int(key, 16)) % len(self._points)
        return self._owners[at]
