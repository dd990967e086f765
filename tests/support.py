"""Helpers the tests import (`from support import ...`): paths, the thread count, subprocess and server helpers.

Kept apart from conftest.py, whose module name a plugin's own tests/conftest.py would shadow.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
THREADS = 2
CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def run_isolated(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter, so a crash fails the test instead of killing pytest."""
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)


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
    yield from _serving(proc, port, "llama-server")


@contextlib.contextmanager
def llamaplug_server(model: Path, *args: str, host: str = "127.0.0.1") -> Iterator[tuple[int, subprocess.Popen]]:
    """`llamaplug serve` on a free port, until the block ends; yields the port and the process."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "serve", "-m", str(model), "--host", host,
                             "--port", str(port), "-t", str(THREADS), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for ready in _serving(proc, port, "llamaplug serve"):
        yield ready, proc


def _serving(proc: subprocess.Popen, port: int, name: str) -> Iterator[int]:
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"{name} exited: {proc.stderr.read()[-3000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"{name} did not become healthy")
                time.sleep(0.3)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def post_json(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def greedy(model, ctx, n: int) -> list[int]:
    """n greedy tokens from the context's last logits, stopping at end of generation (as llama-mtmd-cli)."""
    import llamaplug as lp

    chain = lp.SamplerChain().greedy()
    out: list[int] = []
    for _ in range(n):
        token = chain.sample(ctx, -1)
        if model.token_is_eog(token):
            break
        out.append(token)
        ctx.decode_single(token)
    return out
