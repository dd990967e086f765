"""Servers for the tests: the pin's native llama-server and `llamaplug serve`, each on a free loopback port."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .settings import THREADS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(bin_dir: Path, model: Path, *args: str) -> Iterator[int]:
    """The pin's native llama-server on a free loopback port, until the block ends; yields the port."""
    port = free_port()
    proc = subprocess.Popen([str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port",
                             str(port), "-t", str(THREADS), "-np", "1", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    yield from _serving(proc, port, "llama-server", term_again_after=3)


@contextlib.contextmanager
def llamaplug_server(model: Path | None, *args: str, host: str = "127.0.0.1", port: int | None = None
                     ) -> Iterator[tuple[int, subprocess.Popen]]:
    """`llamaplug serve` on a free port (or `port`), until the block ends; yields the port and the process.

    `model` None: no -m (`args` say what to serve: --models-dir, say).
    """
    port = port or free_port()
    given = ["-m", str(model)] if model is not None else []
    proc = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "serve", *given, "--host", host,
                             "--port", str(port), "-t", str(THREADS), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for ready in _serving(proc, port, "llamaplug serve"):
        yield ready, proc


class RestartableServer:
    """`llamaplug serve` (llamaplug_server's arguments) that a test can restart: `restart` stops it, its process
    gone, then starts it again with the same arguments on the same port (serve binds with SO_REUSEADDR), so the
    clients made before reach the new process. Use as a context manager."""

    def __init__(self, model: Path | None, *args: str):
        self._model, self._args = model, args
        self._stack = contextlib.ExitStack()
        self.port, self.proc = self._stack.enter_context(llamaplug_server(model, *args))

    def restart(self) -> subprocess.Popen:
        """Stop the server, wait until its process is gone, start it again; the stopped process."""
        old = self.proc
        self._stack.close()
        old.wait(timeout=30)  # (after a kill too)
        self.port, self.proc = self._stack.enter_context(llamaplug_server(self._model, *self._args, port=self.port))
        return old

    def __enter__(self) -> RestartableServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def wait_healthy(proc: subprocess.Popen, port: int, name: str) -> None:
    """Until the server `proc` started on `port` answers /health with 200 (fails the test if it exits or 120 s pass)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"{name} exited: {proc.stderr.read()[-3000:] if proc.stderr else ''}")
            if time.monotonic() > deadline:
                pytest.fail(f"{name} did not become healthy")
            time.sleep(0.05)  # a refused connect costs nothing; a longer nap is idle time at every server start


def _serving(proc: subprocess.Popen, port: int, name: str, term_again_after: float | None = None) -> Iterator[int]:
    try:
        wait_healthy(proc, port, name)
        yield port
    finally:
        proc.terminate()
        try:
            if term_again_after is not None:
                # The pin's llama-server answers /health 200 before its task loop starts, and a SIGTERM in between
                # is lost (the loop's start sets `running` again): it then serves on until killed, 30 s here.
                # Its second SIGTERM ends it at once (its "Ctrl+C twice").
                try:
                    proc.wait(timeout=term_again_after)
                except subprocess.TimeoutExpired:
                    proc.terminate()
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def post_json(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def post_status(port: int, path: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
    """POST `body` as JSON; the status and the JSON body, an error's too (a 4xx or 5xx is an answer here)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def on_both(bin_dir: Path, model: Path, script: Callable[[int], Any], *args: str) -> dict[str, Any]:
    """`script(port)` against the pin's llama-server (--jinja) and then `llamaplug serve`, both given `args`:
    {"theirs": ..., "ours": ...}."""
    with llama_server(bin_dir, model, *args, "--jinja") as port:
        theirs = script(port)
    with llamaplug_server(model, *args) as (port, _):
        ours = script(port)
    return {"theirs": theirs, "ours": ours}
