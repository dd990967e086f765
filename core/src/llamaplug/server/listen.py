"""llama-server's --host: several addresses, comma-separated, and unix socket paths (ending in .sock).

uvicorn binds one address itself; for more, the sockets are made here and handed to one
uvicorn server, which serves them all from one event loop (one engine per model whichever
address a request came on).
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any

from ..errors import InvalidParameterError


def sockets(hosts: str, port: int) -> list[socket.socket]:
    """A bound socket for each of `hosts` (comma-separated; a path ending in .sock is a unix socket).

    A unix socket path that exists is replaced only if it is a socket (a stale one from an earlier run).
    """
    made: list[socket.socket] = []
    try:
        for host in (h.strip() for h in hosts.split(",")):
            if not host:
                continue
            made.append(_unix(host) if host.endswith(".sock") else _tcp(host, port))
    except BaseException:
        for sock in made:
            sock.close()
        raise
    if not made:
        raise InvalidParameterError(f"--host {hosts!r} names no address", field="host")
    return made


def _tcp(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise InvalidParameterError(f"--host {host}: {exc}", field="host") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:  # as llama-server: with several addresses, :: is IPv6 only
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise InvalidParameterError(f"--host {host} --port {port}: cannot listen there ({exc.strerror})",
                                    field="host") from None
    return sock


def _unix(path: str) -> socket.socket:
    where = Path(path)
    if where.is_socket():
        where.unlink()
    elif where.exists():
        raise InvalidParameterError(f"--host {path}: a file that is not a socket is there", field="host")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise InvalidParameterError(f"--host {path}: cannot listen there ({exc.strerror})", field="host") from None
    return sock


def serve_on(app: Any, bound: list[socket.socket], grace: float | None = None, **options: Any) -> None:
    """Serve `app` on the sockets `bound` (sockets()'s) until stopped (shutdown.py; `grace`: its
    --shutdown-timeout); they are closed after, unix socket files removed. `options`: uvicorn.Config's others
    (http_limits.uvicorn_options)."""
    from . import shutdown

    # Read before serving: stopping closes the listening sockets, and a closed socket has no name (EBADF).
    paths = [sock.getsockname() for sock in bound if sock.family == socket.AF_UNIX]
    try:
        shutdown.serve(app, shutdown.DEFAULT_GRACE if grace is None else grace, sockets=bound,
                       **{"log_level": "warning", **options})
    finally:
        for sock in bound:
            sock.close()
        for path in paths:
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)
