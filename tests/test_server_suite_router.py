"""A models dir served as the pin's test_router.py drives llama-server's router (issue 48 part 6): POST /models/load
answers {"success": true} (the suite's _load_model_and_wait checks it), every streamed chat chunk has its
finish_reason (null until the last; the suite's stream test reads choice["finish_reason"] on each), and with
--no-models-autoload a request for a model not loaded is a 400 until /models/load. The pin's llama-server in router
mode (--models-dir) and `llamaplug serve --models-dir`, on the same folder, compared. Then the router's GET /props,
--models-preset (an INI file of models; GET /models?reload=1 reads it again; dedup-cache-models) and DELETE /models,
each compared with llama-server's router on the same files and the same Hugging Face cache layout. Last, the
suite's queue tests' LLAMA_SERVER_DEBUG_FAKE_TIMING (2 s more on each load and each routed request) and a client that
gives up while queued behind a busy model, which must not cost that model its place.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from llamaplug_testing import THREADS, free_port, llamaplug_server, post_status
from llamaplug_testing.servers import _serving


@contextlib.contextmanager
def native_server(bin_dir: Path, cache: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[int]:
    """llama-server with no model: its router over the Hugging Face cache `cache` (LLAMA_CACHE) and `args`."""
    port = free_port()
    proc = subprocess.Popen([str(bin_dir / "llama-server"), "--host", "127.0.0.1", "--port", str(port),
                             "-t", str(THREADS), "-np", "1", "-c", "512", "--offline", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={"LLAMA_CACHE": str(cache), "PATH": "/usr/bin:/bin", **(env or {})})
    yield from _serving(proc, port, "llama-server", term_again_after=3)


@contextlib.contextmanager
def native_router(bin_dir: Path, models_dir: Path, cache: Path, *args: str,
                  env: dict[str, str] | None = None) -> Iterator[int]:
    """llama-server with no model: its router, each model of `models_dir` a child server loaded when asked."""
    with native_server(bin_dir, cache, "--models-dir", str(models_dir), *args, env=env) as port:  # (no cached models)
        yield port


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


def _get(port: int, path: str, method: str = "GET") -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _ids(port: int, reload: bool = False) -> set[str]:
    status, body = _get(port, "/models" + ("?reload=1" if reload else ""))
    assert status == 200, body
    return {m["id"] for m in body["data"]}


def test_router_props_as_llama_servers_router(native_tools, smollm2_path, tmp_path):
    """The suite's test_router_props: GET /props of a router (no `model`) describes the router."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("smollm2.gguf", "other.gguf"):
        (models / name).symlink_to(smollm2_path)

    def script(port: int) -> dict:
        status, body = _get(port, "/props")
        return {"status": status, "role": body.get("role"), "max_instances": body.get("max_instances"),
                "models_autoload": body.get("models_autoload"), "b": str(body.get("build_info")).startswith("b"),
                "keys": set(body)}

    flags = ("--models-max", "2", "--no-models-autoload")
    with native_router(native_tools, models, tmp_path / "cache", *flags) as port:
        theirs = script(port)
    with llamaplug_server(None, "--models-dir", str(models), "-c", "512", "-np", "1", *flags) as (port, _):
        ours = script(port)
    assert theirs["status"] == 200 and theirs["role"] == "router"
    assert ours.pop("keys") >= theirs.pop("keys")
    assert ours == theirs == {"status": 200, "role": "router", "max_instances": 2, "models_autoload": False,
                              "b": True}


def test_models_preset_reload_as_llama_servers_router(native_tools, smollm2_path, tmp_path):
    """The suite's test_router_reload_models: GET /models?reload=1 reads the preset file again (a model gone is
    forgotten, a new one listed), with a [*] section, a key by its LLAMA_ARG_* name, a comment, and a section's tag
    written upper case (the id a cached model of that tag has)."""
    preset = tmp_path / "models.ini"

    def write(*names: str) -> None:
        preset.write_text("version = 1\n[*]\nLLAMA_ARG_CTX_SIZE = 512 ; every model's\n\n" + "".join(
            f"[{name}]\nmodel = {smollm2_path}\nalias = {name}-alias\n\n" for name in names))

    def script(port: int) -> list:
        write("model-a", "model-b")
        try:
            first = _ids(port)
            write("model-b", "model-c:q8_0")
            return [first, _ids(port, reload=True), _get(port, "/models")[1]["data"][0]["aliases"]]
        finally:
            write("model-a", "model-b")

    write("model-a", "model-b")
    (tmp_path / "cache").mkdir()
    with native_server(native_tools, tmp_path / "cache", "--models-preset", str(preset)) as port:
        theirs = script(port)
    with llamaplug_server(None, "--models-preset", str(preset), "-c", "512", "-np", "1") as (port, _):
        ours = script(port)
    assert theirs == [{"model-a", "model-b"}, {"model-b", "model-c:Q8_0"}, ["model-b-alias"]]
    assert ours == theirs


def _hub_cache(folder: Path, model: Path) -> dict[str, str]:
    """A Hugging Face cache with two repositories, each one file (`model`): their ids, as both list them.

    beta, which the test deletes, is a copy: llama-server's DELETE /models deletes a snapshot's file and, when that
    is a symbolic link, the file it points to (common_download_remove: the blob), here the shared test model."""
    repos = {"test-org/alpha-GGUF": "alpha-Q8_0.gguf", "test-org/beta-GGUF": "beta-F32.gguf"}
    for repo, name in repos.items():
        repo_dir = folder / ("models--" + repo.replace("/", "--"))
        snapshot = repo_dir / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True)
        (repo_dir / "refs").mkdir()
        (repo_dir / "refs" / "main").write_text("0" * 40)
        if "beta" in repo:
            shutil.copyfile(model, snapshot / name)
        else:
            (snapshot / name).symlink_to(model)
    return {"alpha": "test-org/alpha-GGUF:Q8_0", "beta": "test-org/beta-GGUF:F32"}


def test_dedup_cache_models_and_delete_as_llama_servers_router(native_tools, smollm2_path, tmp_path, monkeypatch):
    """The suite's test_router_dedup_cache_models (a preset's dedup-cache-models hides the cached model of its
    hf-repo from GET /models, in its section or in [*]; the hidden model still serves) and DELETE /models
    (test_router_delete_model's request): llama-server's router lists its cache, serve is given the same models as
    -m org/repo:TAG from the same cache."""
    preset = tmp_path / "models.ini"

    def write(where: str | None) -> None:
        preset.write_text(("[*]\ndedup-cache-models = 1\n\n" if where == "global" else "")
                          + "[model-dedup]\nhf-repo = test-org/alpha-GGUF\n"
                          + ("dedup-cache-models = on\n" if where == "section" else ""))

    def script(port: int, ids: dict[str, str]) -> dict:
        write("section")
        out: dict = {"section": _ids(port)}
        out["hidden_serves"] = post_status(port, "/tokenize", {"model": ids["alpha"], "content": "hello"})[0]
        write(None)
        out["off"] = _ids(port, reload=True)
        write("global")
        out["global"] = _ids(port, reload=True)
        out["delete_nameless"] = _get(port, "/models", "DELETE")[0]
        out["delete_preset_refused"] = _get(port, "/models?model=model-dedup", "DELETE")[0] >= 400
        out["delete"] = _get(port, f"/models?model={ids['beta']}", "DELETE")
        out["after"] = _ids(port)
        return out

    write("section")
    theirs_ids = _hub_cache(tmp_path / "theirs", smollm2_path)  # (llama-server deletes a model's files)
    with native_server(native_tools, tmp_path / "theirs", "--models-preset", str(preset)) as port:
        theirs = script(port, theirs_ids)
    ids = _hub_cache(tmp_path / "ours", smollm2_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "ours"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write("section")
    with llamaplug_server(None, "-m", ids["alpha"], "-m", ids["beta"], "--models-preset", str(preset), "-c", "512",
                          "-np", "1", "--offline") as (port, _):
        ours = script(port, ids)
    assert theirs == {"section": {"model-dedup", ids["beta"]}, "hidden_serves": 200,
                      "off": {"model-dedup", ids["alpha"], ids["beta"]}, "global": {"model-dedup", ids["beta"]},
                      "delete_nameless": 400, "delete_preset_refused": True, "delete": (200, {"success": True}),
                      "after": {"model-dedup"}}
    assert ours == theirs


def test_bad_preset_is_an_error_naming_file_and_line(native_tools, tmp_path):
    """A preset file that cannot be served stops serve at its start with one line naming the file, the line and
    the key (no traceback); the pin's llama-server refuses the same files (it names the file, or the key)."""
    cases = {"indented.ini": ("[a]\nmodel = x.gguf\n  c = 512\n", "line 3"),
             "unknown.ini": ("[a]\nmodel = x.gguf\nno-such-flag = 1\n", "'no-such-flag'")}
    for name, (text, said) in cases.items():
        (tmp_path / name).write_text(text)
        native = subprocess.run([str(native_tools / "llama-server"), "--models-preset", str(tmp_path / name),
                                 "--port", str(free_port()), "--offline"], capture_output=True, text=True, timeout=60,
                                env={"LLAMA_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"})
        ours = subprocess.run([sys.executable, "-m", "llamaplug.cli", "serve", "--models-preset", str(tmp_path / name),
                               "--port", str(free_port())], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert native.returncode != 0, name
        assert ours.returncode != 0, name
        assert f"{tmp_path / name}" in ours.stderr and said in ours.stderr, ours.stderr
        assert "Traceback" not in ours.stderr, ours.stderr


FAKE_TIMING = {"LLAMA_SERVER_DEBUG_FAKE_TIMING": "1"}


def _tokenize(port: int, model: str, timeout: float = 60) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": model, "content": "hello world"}).encode())
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status


def _queue_client_leaves(port: int, queued: Callable[[int, str, float], object] = _tokenize) -> dict:
    """The suite's test_router_queue_client_disconnect_keeps_model, timed: with --models-max 1, a request for
    `busy` holds its model (2 s of fake timing), one for `other` (`queued`) queues behind it, its client leaving
    after 1 s."""
    started = time.monotonic()
    post_status(port, "/models/load", {"model": "busy"})
    _wait_loaded(port, "busy")
    loaded = time.monotonic() - started
    busy: dict = {}

    def run() -> None:
        t0 = time.monotonic()
        busy["status"] = _tokenize(port, "busy")
        busy["seconds"] = time.monotonic() - t0

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)
    try:
        queued(port, "other", 1)
        gave_up = False
    except OSError:  # (TimeoutError: urllib closes the connection)
        gave_up = True
    thread.join(60)
    time.sleep(3)  # what an eviction on the leaver's behalf would have had to happen in
    _, body = _get(port, "/models")
    states = {m["id"]: m["status"]["value"] for m in body["data"]}
    return {"load_took_2s": loaded >= 2, "busy": (busy.get("status"), busy.get("seconds", 0) >= 2),
            "gave_up": gave_up, "states": states}


def test_fake_timing_and_a_client_leaving_the_queue_as_llama_servers_router(native_tools, smollm2_path, tmp_path,
                                                                          monkeypatch):
    """LLAMA_SERVER_DEBUG_FAKE_TIMING, which the suite sets for every server: in a router each load and each
    routed request take 2 s longer (so a request queues behind a busy model), and a queued client that leaves
    costs the busy model nothing: it stays loaded, the other model is not loaded for nobody."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("busy.gguf", "other.gguf"):
        (models / name).symlink_to(smollm2_path)
    flags = ("--models-max", "1")
    with native_router(native_tools, models, tmp_path / "cache", *flags, env=FAKE_TIMING) as port:
        theirs = _queue_client_leaves(port)
    monkeypatch.setenv(*next(iter(FAKE_TIMING.items())))
    with llamaplug_server(None, "--models-dir", str(models), "-c", "512", "-np", "1", *flags) as (port, _):
        ours = _queue_client_leaves(port)
    assert theirs == {"load_took_2s": True, "busy": (200, True), "gave_up": True,
                      "states": {"busy": "loaded", "other": "unloaded"}}
    assert ours == theirs


def _ollama_generate(port: int, model: str, timeout: float) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/generate", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": model, "prompt": "hi", "stream": False,
                                                  "options": {"num_predict": 1}}).encode())
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status


def test_an_ollama_client_leaving_the_queue_costs_the_busy_model_nothing(smollm2_path, tmp_path, monkeypatch):
    """The same with the queued request on Ollama's /api/generate, whose routes take their lease themselves
    (llama-server has no Ollama API: what the test above showed of its router is the reference)."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("busy.gguf", "other.gguf"):
        (models / name).symlink_to(smollm2_path)
    monkeypatch.setenv(*next(iter(FAKE_TIMING.items())))
    with llamaplug_server(None, "--models-dir", str(models), "-c", "512", "-np", "1", "--models-max", "1") as (port, _):
        ours = _queue_client_leaves(port, _ollama_generate)
    assert ours == {"load_took_2s": True, "busy": (200, True), "gave_up": True,
                    "states": {"busy": "loaded", "other": "unloaded"}}
