"""CORS as llama-server answers it: --cors-origins, --cors-methods, --cors-headers, --cors-credentials.

Every response carries Access-Control-Allow-Origin; a preflight (OPTIONS, any path) is
answered before the API key is checked (a browser sends no key with it), with the
allowed credentials, methods and headers. Defaults are llama-server's: any origin, with
credentials, so the request's Origin is echoed back (a browser takes no "*" with credentials).

One choice differs: an origin outside a list of several gets no header at all, and one in
it gets its own origin back; llama-server sends the whole comma-separated list, which a
browser refuses for every origin (the header holds one origin). With one origin listed
the two answer the same.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit

DEFAULT_METHODS = "GET, POST, DELETE, OPTIONS"


@dataclasses.dataclass(frozen=True)
class Cors:
    """The CORS settings. `origins`: "*", "localhost" (reflect a loopback origin only) or a comma-separated list."""

    origins: str = "*"
    methods: str = DEFAULT_METHODS
    headers: str = "*"
    credentials: bool = True

    def allow_origin(self, origin: str | None) -> str | None:
        """Access-Control-Allow-Origin for a request from `origin` (None: no header, the browser refuses)."""
        if self.origins == "*":
            return (origin or None) if self.credentials else "*"
        if not origin:
            return None
        if self.origins == "localhost":
            return origin if _is_loopback(origin) else None
        listed = [o.strip() for o in self.origins.split(",")]
        return origin if origin in listed else None

    def preflight(self) -> list[tuple[bytes, bytes]]:
        """The headers a preflight's answer adds to Access-Control-Allow-Origin."""
        return [(b"access-control-allow-credentials", b"true" if self.credentials else b"false"),
                (b"access-control-allow-methods", self.methods.encode("latin-1")),
                (b"access-control-allow-headers", self.headers.encode("latin-1"))]


def _is_loopback(origin: str) -> bool:
    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    return host in ("localhost", "127.0.0.1", "::1")
