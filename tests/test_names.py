"""One resolver for a model's name (issue 48 part 3), through the commands a user types.

A path, a catalog name (with Ollama's ":latest" or not) and `org/repo[:TAG]` from the Hugging Face
cache name the same file for `run`, `show`, `inspect`, `rm` and `serve -m` / `-hf`; a cached model is
read without one request to the Hub (a hub-shaped endpoint counts them); `llamaplug list` shows every
model the CLI can run, the installed catalog models included; `run MODEL PROMPT` chats as `ollama run`
(the library's greedy chat reply is the reference), `--raw` completes; `pull` without a Hub fails in one line.
No test downloads anything: the cache is laid out by hand (tests/test_hub.py's hand_made_cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from fixtures.tiny_gguf import model_bytes
from llamaplug_testing import Terminal, llamaplug_server
from test_hub import FakeHub, hand_made_cache

import llamaplug as lp
from llamaplug.high import names

pytest.importorskip("huggingface_hub", reason='the hub extra: pip install "llamaplug[hub]"')
hub_constants = pytest.importorskip("huggingface_hub.constants")

REPO = "hand/made-GGUF"  # hand_made_cache's repository
PROMPT = "Name one fruit."


@pytest.fixture(scope="module")
def tiny() -> dict[str, bytes]:
    return {"m-Q8_0.gguf": model_bytes("llama"), "m-Q6_K.gguf": model_bytes("llama", (("llamaplug.variant", 1),))}


@pytest.fixture(scope="module")
def no_hub():
    """A Hub endpoint with no repository: any request the commands make to it is counted (and fails)."""
    server = FakeHub({})
    yield server
    server.server.shutdown()


@pytest.fixture
def cache(tmp_path, tiny) -> Path:
    root = tmp_path / "hub"
    hand_made_cache(root, tiny)
    return root


@pytest.fixture
def env(cache, no_hub) -> dict[str, str]:
    """The commands' environment: the hand-made cache, the Hub online (not HF_HUB_OFFLINE) but empty."""
    no_hub.requests.clear()
    out = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_ENDPOINT": no_hub.url, "HF_HUB_DISABLE_TELEMETRY": "1"}
    out.pop("HF_HUB_OFFLINE", None)
    return out


def cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamaplug.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env, input=stdin)


def test_one_resolver_for_every_form(cache, monkeypatch, smollm2_path, no_hub):
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "ENDPOINT", no_hub.url)
    no_hub.requests.clear()
    snapshot = next((cache / "models--hand--made-GGUF" / "snapshots").iterdir())
    assert Path(names.resolve(f"{REPO}:Q6_K")) == snapshot / "m-Q6_K.gguf"
    assert Path(names.resolve(f"hf.co/{REPO}:Q8_0:latest")) == snapshot / "m-Q8_0.gguf"
    assert no_hub.requests == []  # cached: the Hub is not asked (offline when cached)
    for name in ("smollm2-135m-instruct", "smollm2-135m-instruct:latest", str(smollm2_path)):
        assert Path(names.resolve(name)) == smollm2_path
    assert names.resolve("models/missing.gguf") == "models/missing.gguf"  # a path stays a path (the loader says)
    with pytest.raises(lp.ModelNotFoundError, match="`llamaplug list`"):  # a bare word is a name: where names are
        names.resolve("llama3")
    with pytest.raises(lp.ModelNotFoundError, match="llamaplug pull org/other:Q4_K_M"):
        names.resolve("org/other:Q4_K_M", download=False)
    assert no_hub.requests == []


def test_list_shows_every_model_the_cli_runs(env, smollm2_path):
    done = cli("list", env=env)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()[1:]}
    assert {"smollm2-135m-instruct", f"{REPO}:Q8_0", f"{REPO}:Q6_K"} <= set(rows)  # the default model too
    for name in rows:  # and each one runs by that name: show reads it
        shown = cli("show", name, env=env)
        assert shown.returncode == 0 and "architecture" in shown.stdout, (name, shown.stderr)
    assert "Q4_1" in rows["smollm2-135m-instruct"]  # SmolLM2's GGUF says general.file_type Q4_1


def test_show_inspect_rm_take_the_same_names(env, cache, no_hub, smollm2_path, tiny):
    for name in ("smollm2-135m-instruct", "smollm2-135m-instruct:latest", f"{REPO}:Q8_0"):
        for command in ("show", "inspect"):
            done = cli(command, name, env=env)
            assert done.returncode == 0, (command, name, done.stderr)
    catalog = cli("rm", "smollm2-135m-instruct", env=env)  # a package's file: said, not deleted
    assert catalog.returncode == 1 and "pip install" in catalog.stderr and len(catalog.stderr.splitlines()) == 1
    assert smollm2_path.is_file()
    removed = cli("rm", f"{REPO}:Q6_K", env=env)
    assert removed.returncode == 0, removed.stderr
    rows = [line.split()[0] for line in cli("list", env=env).stdout.splitlines()[1:]]
    assert f"{REPO}:Q8_0" in rows and f"{REPO}:Q6_K" not in rows
    assert no_hub.requests == []
    model, notes = cache.parent / "mine.gguf", cache.parent / "notes.gguf"
    model.write_bytes(tiny["m-Q8_0.gguf"])
    notes.write_text("not a model\n")
    kept = cli("rm", str(notes), env=env)  # a file that is no GGUF model stays
    assert kept.returncode == 1 and notes.is_file() and "Traceback" not in kept.stderr
    assert cli("rm", str(model), env=env).returncode == 0 and not model.exists()


def test_run_chats_as_ollama_run_and_raw_completes(env, llama):
    want = llama.create_chat_completion([{"role": "user", "content": PROMPT}], max_tokens=16,
                                        sampler=lp.SamplerChain().greedy()).choices[0].message.content
    flags = ["-n", "16", "--temp", "0", "-c", "2048", "-t", "2"]
    done = cli("run", "smollm2-135m-instruct:latest", PROMPT, *flags, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == want + "\n"
    piped = cli("run", "smollm2-135m-instruct", *flags, env=env, stdin=PROMPT)  # stdin is the prompt, as Ollama
    assert piped.returncode == 0 and piped.stdout == want + "\n", piped.stderr
    raw = cli("run", "--raw", PROMPT, *flags, env=env)  # the default model, a completion of the text as it is
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout == PROMPT + llama.create_completion(PROMPT, max_tokens=16).text + "\n"


def test_pull_without_the_hub_fails_in_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": "http://127.0.0.1:9",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    done = cli("pull", "org/absent:Q8_0", env=env)
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "MaxRetryError" not in done.stderr and "Connection refused" in done.stderr and "org/absent" in done.stderr


def test_chat_takes_hf_as_run_and_serve_do(env, no_hub):
    # Before: chat had no -hf, and argparse read it as -h with an argument ("ignored explicit argument 'f'").
    done = cli("chat", "-hf", f"{REPO}:Q8_0", "-n", "2", "-c", "128", "-t", "1", env=env, stdin="Hi\n")
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    assert no_hub.requests == []  # cached: read without the Hub


def test_pull_of_a_cached_model_without_the_hub_uses_the_cache_at_once(cache):
    # Before: the listing fell back on the cache, then hf_hub_download's HEAD of the file retried five times
    # (1+2+4+8+8 s) with a MaxRetryError warning each before it fell back too.
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_ENDPOINT": "http://127.0.0.1:9",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    done = cli("pull", f"{REPO}:Q8_0", env=env)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).name == "m-Q8_0.gguf"
    assert "Retrying" not in done.stderr and "MaxRetryError" not in done.stderr, done.stderr
    assert "Connection refused): using the local cache" in done.stderr


def test_serve_takes_hub_names_from_the_cache(cache, no_hub, tiny):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_CACHE", str(cache))
        mp.setenv("HF_ENDPOINT", no_hub.url)
        mp.delenv("HF_HUB_OFFLINE", raising=False)
        no_hub.requests.clear()
        with llamaplug_server(None, "-m", f"{REPO}:Q8_0", "-hf", f"hf.co/{REPO}:Q6_K", "-c", "128") as (port, _):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as resp:
                ids = [m["id"] for m in json.loads(resp.read())["data"]]
            assert ids == [f"{REPO}:Q8_0", f"hf.co/{REPO}:Q6_K"]
            for model in ids:
                body = json.dumps({"model": model, "prompt": "a", "max_tokens": 2}).encode()
                request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=120) as resp:  # loaded, and it generates
                    reply = json.loads(resp.read())  # (random weights: their first token may be the end)
                assert reply["model"] == model and 1 <= reply["usage"]["completion_tokens"] <= 2
    assert no_hub.requests == []


def test_run_model_alone_is_a_conversation_in_a_terminal(llama):
    import pty

    want = llama.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4,
                                        sampler=lp.SamplerChain().greedy()).choices[0].message.content
    pid, fd = pty.fork()
    if pid == 0:  # the child: `ollama run MODEL`'s habit, on a terminal
        os.execv(sys.executable, [sys.executable, "-m", "llamaplug.cli", "run", "smollm2-135m-instruct", "--temp", "0",
                                  "-n", "4", "-c", "2048", "-t", "2"])
    term = Terminal(fd)
    try:
        term.until(b">>> ")
        os.write(fd, b"Hi\n")
        term.until(b">>> ", count=2)  # the reply, then the next prompt
        os.write(fd, b"/bye\n")
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    reply = term.seen.split(b">>> ")[1].decode().replace("\r\n", "\n")
    assert reply == "Hi\n" + want + "\n", reply  # (the terminal echoes the line typed)
