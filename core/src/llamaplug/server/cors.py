"""CORS as llama-server answers it: --cors-origins, --cors-methods, --cors-headers, --cors-credentials.

Every response carries Access-Control-Allow-Origin; a preflight (OPTIONS, any path) is
answered before the API key is checked (a browser sends no key with it), with the
allowed credentials, methods and headers. `Cors()`'s defaults are llama-server's: any origin,
with credentials, so the request's Origin is echoed back (a browser takes no "*" with credentials).

One choice differs: an origin outside a list of several gets no header at all, and one in
it gets its own origin back; llama-server sends the whole comma-separated list, which a
browser refuses for every origin (the header holds one origin). With one origin listed
the two answer the same.

`llamaplug serve` without --api-key is stricter than llama-server (`Cors.serving`): CORS
alone only keeps a page from reading an answer, while a "simple" request (a text/plain
POST) from any page the user visits still runs, and a page whose name is made to resolve
to 127.0.0.1 (DNS rebinding) is the server's own origin. So, with no key, a request
with an Origin that is neither a loopback page (llama-server's "localhost": localhost,
127.0.0.1, [::1]), the server's own origin nor one that
--cors-origins lists is refused (403), and a request that came in on a loopback address
must name a loopback host (or one of those origins' hosts) in its Host header (403). With
--api-key, or --cors-origins "*", llama-server's behaviour is kept.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from urllib.parse import urlsplit

DEFAULT_METHODS = "GET, POST, DELETE, OPTIONS"


@dataclasses.dataclass(frozen=True)
class Cors:
    """The CORS settings. `origins`: "*", "localhost" (reflect a loopback origin only) or a comma-separated list.

    `strict`: refuse what a browser sends from an origin not allowed, and check the Host header of requests that
    came in on a loopback address (see the module's doc; `refusal`)."""

    origins: str = "*"
    methods: str = DEFAULT_METHODS
    headers: str = "*"
    credentials: bool = True
    strict: bool = False

    @classmethod
    def serving(cls, origins: str | None, methods: str = DEFAULT_METHODS, headers: str = "*",
                credentials: bool = True, api_key: str | None = None) -> Cors:
        """`llamaplug serve`'s: `origins` as --cors-origins gave it (None: not given). With an API key, or
        origins "*", llama-server's; with no key, loopback pages only (and what `origins` lists), strictly."""
        if api_key is not None or origins == "*":
            return cls(origins or "*", methods, headers, credentials)
        return cls(origins or "localhost", methods, headers, credentials, strict=True)

    def refusal(self, origin: str | None, host: str | None, server: tuple[str, int | None] | None
                ) -> tuple[str, str] | None:
        """Under `strict`: (header, why) where a request from `origin` with Host `host`, come in on the local
        address `server` (the ASGI scope's), is refused; None where it is not (or not `strict`)."""
        if not self.strict:
            return None
        if host and server and _is_loopback_ip(server[0]) and not self._host_allowed(host):
            return "host", (f"the Host header {_short(host)} names no loopback host: this server has no --api-key "
                            "and answers on a loopback address only requests that name it as localhost or "
                            "127.0.0.1 (a web page cannot reach it through a DNS name); --cors-origins names "
                            "other origins whose hosts may reach it, --api-key lifts the check")
        if origin and self.allow_origin(origin) is None and not _same_origin(origin, host):
            return "origin", (f"requests from the web page origin {_short(origin)} are refused: this server has no "
                              "--api-key and takes browser requests only from loopback pages and from the origins "
                              "--cors-origins lists (--cors-origins \"*\" or --api-key opens it to any)")
        return None

    def _host_allowed(self, host: str) -> bool:
        name = _hostname("//" + host)
        if name is None:
            return False
        if _is_loopback_name(name):
            return True
        listed = [o.strip() for o in self.origins.split(",")] if self.origins not in ("*", "localhost") else []
        return any(_hostname(o) == name for o in listed)

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
    """llama-server's origin_is_localhost (server-http.cpp)."""
    return _hostname(origin) in ("localhost", "127.0.0.1", "::1")


def _hostname(url: str) -> str | None:
    """The host of `url` ("//host:port" for a Host header), lower case, without a final dot; None: none."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    return host.rstrip(".") if host else None


def _is_loopback_name(host: str) -> bool:
    """Whether `host` names this machine whatever a DNS server says: localhost (and *.localhost, which browsers
    resolve to loopback themselves) or a loopback address."""
    return host == "localhost" or host.endswith(".localhost") or _is_loopback_ip(host)


def _is_loopback_ip(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _same_origin(origin: str, host: str | None) -> bool:
    """Whether a page of `origin` is the server's own, reached as `host` (the chat page, from wherever it was
    loaded: a Host that names no loopback name was checked first, where the check applies)."""
    try:
        return host is not None and urlsplit(origin).netloc.lower() == host.lower()
    except ValueError:
        return False


def _short(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "...")
