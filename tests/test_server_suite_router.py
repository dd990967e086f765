"""A models dir served as the pin's test_router.py drives llama-server's router (issue 48 part 6): POST /models/load
answers {"success": true} (the suite's _load_model_and_wait checks it), every streamed chat chunk has its
finish_reason (null until the last; the suite's stream test reads choice["finish_reason"] on each), and with
--no-models-autoload a request for a model not loaded is a 400 until /models/load. The pin's llama-server in router
mode (--models-dir) and `llamaplug serve --models-dir`, on the same folder, compared.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from llamaplug_testing import THREADS, free_port, llamaplug_server, post_status
from llamaplug_testing.servers import _serving


@contextlib.contextmanager
def native_router(bin_dir: Path, models_dir: Path, cache: Path, *args: str) -> Iterator[int]:
    """llama-server with no model: its router, each model of `models_dir` a child server loaded when asked."""
    port = free_port()
    proc = subprocess.Popen([str(bin_dir / "llama-server"), "--models-dir", str(models_dir), "--host", "127.0.0.1",
                             "--port", str(port), "-t", str(THREADS), "-np", "1", "-c", "512", "--offline", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={"LLAMA_CACHE": str(cache), "PATH": "/usr/bin:/bin"})  # (no cached models listed)
    yield from _serving(proc, port, "llama-server", term_again_after=3)


def _stream(port: int, body: dict) -> list[dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        lines = [line.decode().strip() for line in resp]
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and "[DONE]" not in line]


def _script(port: int) -> dict:
    status, body = post_status(port, "/models/load", {"model": "smollm2"})
    chunks = _stream(port, {"model": "smollm2", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
                            "stream": True})
    with_choices = [c["choices"][0] for c in chunks if c.get("choices")]
    return {"load": (status, body.get("success")), "chunks": bool(with_choices),
            "finish_reason_in_each": all("finish_reason" in c for c in with_choices),
            "null_until_the_last": all(c.get("finish_reason") is None for c in with_choices[:-1])}


def test_models_dir_load_and_stream_as_llama_servers_router(native_tools, smollm2_path, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "smollm2.gguf").symlink_to(smollm2_path)
    with native_router(native_tools, models, tmp_path / "cache") as port:
        theirs = _script(port)
    with llamaplug_server(None, "--models-dir", str(models), "-c", "512", "-np", "1") as (port, _):
        ours = _script(port)
    assert theirs == {"load": (200, True), "chunks": True, "finish_reason_in_each": True, "null_until_the_last": True}
    assert ours == theirs


def _wait_loaded(port: int, model: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/models", timeout=60) as resp:
            listed = {m["id"]: m["status"]["value"] for m in json.loads(resp.read())["data"]}
        if listed.get(model) == "loaded":
            return
        time.sleep(0.05)
    raise AssertionError(f"{model} did not load")


def _no_autoload(port: int) -> dict:
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    before = post_status(port, "/v1/chat/completions", chat)
    loaded = post_status(port, "/models/load", {"model": "smollm2"})
    _wait_loaded(port, "smollm2")  # (llama-server's router answers the load before its child serves)
    after = post_status(port, "/v1/chat/completions", chat)
    return {"before": (before[0], "error" in before[1]), "load": loaded[0], "after": after[0]}


def test_no_models_autoload_as_llama_servers_router(native_tools, smollm2_path, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    # two models: serve loads the only model of a dir at its start (llama-server's router never does)
    for name in ("smollm2.gguf", "other.gguf"):
        (models / name).symlink_to(smollm2_path)
    with native_router(native_tools, models, tmp_path / "cache", "--no-models-autoload") as port:
        theirs = _no_autoload(port)
    with llamaplug_server(None, "--models-dir", str(models), "-c", "512", "-np", "1", "--no-models-autoload"
                          ) as (port, _):
        ours = _no_autoload(port)
    assert theirs == {"before": (400, True), "load": 200, "after": 200}
    assert ours == theirs
