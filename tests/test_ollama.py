"""Ollama's API on `llamaplug serve`, driven by the official `ollama` Python client.

One server (SmolLM2 and Gemma-3 from a models dir) answers the client's list, show, chat and
generate (whole and streamed), tools, format, embed, ps, keep_alive 0, pull and errors. What
is "right" comes from elsewhere: the greedy text of the same server's /v1 routes (the openai
client), the GGUF's metadata as gguf-py reads it, jsonschema for `format`, and a hub-shaped
endpoint (tests/test_hub.py's) serving a generated GGUF for /api/pull.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gguf
import httpx
import jsonschema
import numpy as np
import openai
import pytest
from fixtures.tiny_gguf import model_bytes
from llamaplug_testing import llamaplug_server
from llamaplug_testing.chat_replies import TIME_TOOL, few_shot
from test_hub import MAIN, FakeHub

import llamaplug as lp

ollama = pytest.importorskip("ollama", reason="the official Ollama client (requirements-reference.txt)")

SLOTS = 2
CTX = 2048
KEY = "ollama-test-key"  # the server's --api-key: every client below sends it
AUTH = {"Authorization": f"Bearer {KEY}"}
HUB_REPO = "org/tiny-GGUF"
FRUITS = [{"role": "user", "content": "Name three fruits."}]


@pytest.fixture(scope="module")
def tiny() -> bytes:
    return model_bytes("llama")


@pytest.fixture(scope="module")
def fake_hub(tiny):
    server = FakeHub({HUB_REPO: {MAIN: {"README.md": b"# tiny\n", "tiny-Q8_0.gguf": tiny}}})
    yield server
    server.server.shutdown()


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path, gemma_path, fake_hub):
    folder = tmp_path_factory.mktemp("models")
    (folder / smollm2_path.name).symlink_to(smollm2_path)
    # SmolLM2's own template has no place for tools (a request with tools is refused): ChatML with tools.
    (folder / "models.toml").write_text(f'["{smollm2_path.name}"]\nchat_template = "chatml-tools"\n')
    (folder / gemma_path.name).symlink_to(gemma_path)
    with pytest.MonkeyPatch.context() as env:  # the server's huggingface_hub: the fake Hub, a fresh cache
        env.setenv("HF_ENDPOINT", fake_hub.url)
        env.setenv("HF_HUB_CACHE", str(tmp_path_factory.mktemp("hf") / "hub"))
        env.setenv("HF_HUB_OFFLINE", "0")
        env.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        with llamaplug_server(None, "--models-dir", str(folder), "--parallel", str(SLOTS), "-c", str(CTX),
                              "--seed", "2", "--api-key", KEY, "-t", "1") as (port, proc):
            # (-t 1 after the helper's -t: two decode threads that wait on each other crawl on a busy machine)
            yield port, proc


@pytest.fixture(scope="module")
def port(server) -> int:
    return server[0]


@pytest.fixture(scope="module")
def client(port):
    return ollama.Client(host=f"http://127.0.0.1:{port}", headers=AUTH)


@pytest.fixture(scope="module")
def oai(port):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def names(smollm2_path, gemma_path) -> tuple[str, str]:
    return smollm2_path.stem, gemma_path.stem  # as /api/tags lists them: the file's name without .gguf


def states(port: int) -> dict[str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers=AUTH)
    with urllib.request.urlopen(request, timeout=30) as resp:
        return {m["id"]: m["status"]["value"] for m in json.loads(resp.read())["data"]}


def wait_for(port: int, model: str, state: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while states(port).get(model) != state:
        assert time.monotonic() < deadline, f"{model} never became {state}: {states(port)}"
        time.sleep(0.05)


def gguf_facts(path: Path) -> dict:
    """What llama.cpp's own loader says the file is (its metadata and counts; gguf-py's enum names the file type)."""
    model = lp.LlamaModel.load(path)
    try:
        meta = model.metadata
        arch = meta["general.architecture"]
        return {"arch": arch, "quant": gguf.LlamaFileType(int(meta["general.file_type"])).name.removeprefix("MOSTLY_"),
                "params": model.n_params, "template": model.chat_template, "n_ctx_train": model.n_ctx_train}
    finally:
        model.close()


def test_list_show_version(client, port, names, smollm2_path, gemma_path):
    listed = {m.model: m for m in client.list().models}
    assert set(listed) == {f"{names[0]}:latest", f"{names[1]}:latest"}
    for name, path in zip(names, (smollm2_path, gemma_path)):
        facts = gguf_facts(path)
        entry = listed[f"{name}:latest"]
        assert entry.details.format == "gguf" and entry.details.family == facts["arch"]
        assert entry.details.quantization_level == facts["quant"]
        assert entry.size == path.stat().st_size
        assert entry.digest == hashlib.sha256(path.read_bytes()).hexdigest()  # Ollama's: the blob's (was of its path)
        number, unit = float(entry.details.parameter_size[:-1]), entry.details.parameter_size[-1]
        assert number * {"K": 1e3, "M": 1e6, "B": 1e9}[unit] == pytest.approx(facts["params"], rel=0.01)
        shown = client.show(name)  # the name without its tag, as Ollama takes it
        assert shown.details.family == facts["arch"] and shown.template == (facts["template"] or "")
        assert shown.modelinfo["general.architecture"] == facts["arch"]
        assert shown.modelinfo[f"{facts['arch']}.context_length"] == facts["n_ctx_train"]
        assert "completion" in shown.capabilities
    version = httpx.get(f"http://127.0.0.1:{port}/api/version", headers=AUTH).json()
    assert [int(p) for p in version["version"].split(".")] >= [0, 5, 0]


def test_a_files_sha256_is_read_once_per_path_size_and_date(tmp_path, monkeypatch):
    """/api/tags' digest never hashes a model twice (gigabytes: seconds each), a big one from the server's start."""
    from llamaplug.high import model_card

    path = tmp_path / "m.gguf"
    path.write_bytes(b"a" * 1000)
    first = model_card.file_sha256(path)
    assert first == hashlib.sha256(b"a" * 1000).hexdigest()
    stat = path.stat()
    path.write_bytes(b"b" * 1000)  # the same size and date: taken as the same file, not read again
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert model_card.file_sha256(path) == first
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a new date: read again
    assert model_card.file_sha256(path) == hashlib.sha256(b"b" * 1000).hexdigest()

    assert model_card.hash_in_background(path) is None  # small: hashed when first listed
    monkeypatch.setattr(model_card, "BACKGROUND_HASH_BYTES", 1000)
    big = tmp_path / "big.gguf"
    big.write_bytes(b"c" * 1000)
    thread = model_card.hash_in_background(big)
    assert thread is not None
    thread.join(10)
    stat = big.stat()
    big.write_bytes(b"d" * 1000)
    os.utime(big, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert model_card.file_sha256(big) == hashlib.sha256(b"c" * 1000).hexdigest()  # the background thread's


@pytest.mark.parametrize("which", [0, 1], ids=["smollm2", "gemma3"])
def test_chat_and_generate_equal_the_v1_routes(client, oai, names, which):
    name = names[which]
    options = {"temperature": 0, "num_predict": 12}
    want = oai.chat.completions.create(model=name, messages=FRUITS, max_tokens=12,
                                       temperature=0).choices[0].message.content
    reply = client.chat(model=name, messages=FRUITS, options=options, stream=False)
    assert reply.message.content == want and reply.message.role == "assistant"
    assert reply.done and reply.done_reason == "length" and reply.eval_count == 12
    assert reply.prompt_eval_count > 0 and reply.total_duration >= reply.eval_duration > 0
    assert reply.model == name
    parts = list(client.chat(model=f"{name}:latest", messages=FRUITS, options=options, stream=True))
    assert "".join(p.message.content for p in parts) == want
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done and parts[-1].eval_count == 12
    # /api/generate: the prompt as one user message (with a system one), or raw as /v1/completions
    system = "You answer in one word."
    want = oai.chat.completions.create(model=name, messages=[{"role": "system", "content": system}, *FRUITS],
                                       max_tokens=12, temperature=0).choices[0].message.content
    done = client.generate(model=name, prompt=FRUITS[0]["content"], system=system, options=options)
    assert done.response == want and done.done_reason == "length"
    streamed = client.generate(model=name, prompt=FRUITS[0]["content"], system=system, options=options, stream=True)
    assert "".join(p.response for p in streamed) == want
    want = oai.completions.create(model=name, prompt="The capital of France is", max_tokens=8,
                                  temperature=0).choices[0].text
    raw = client.generate(model=name, prompt="The capital of France is", raw=True,
                          options={"temperature": 0, "num_predict": 8})
    assert raw.response == want and raw.eval_count == 8
    streamed = client.generate(model=name, prompt="The capital of France is", raw=True, stream=True,
                               options={"temperature": 0, "num_predict": 8})
    assert "".join(p.response for p in streamed) == want


def test_stop_and_seed_options(client, oai, names):
    name = names[0]
    want = oai.chat.completions.create(model=name, messages=FRUITS, max_tokens=24, temperature=0.9, seed=7,
                                       stop=["\n"], extra_body={"top_k": 20}).choices[0].message.content
    got = client.chat(model=name, messages=FRUITS, options={"temperature": 0.9, "seed": 7, "top_k": 20,
                                                             "stop": ["\n"], "num_predict": 24})
    assert got.message.content == want and "\n" not in got.message.content


def test_tool_calls_have_object_arguments(client, oai, port, names):
    name = names[0]
    messages = few_shot("hermes")  # SmolLM2-135M calls a tool only after seeing it done
    options = {"temperature": 0, "num_predict": 64}
    # The model decides (Ollama has no tool_choice): whatever it does, it is what /v1/chat/completions gives.
    want = oai.chat.completions.create(model=name, messages=messages, tools=[TIME_TOOL], max_tokens=64,
                                       temperature=0).choices[0].message
    reply = client.chat(model=name, messages=messages, tools=[TIME_TOOL], options=options)
    assert reply.message.content == (want.content or "")
    assert [(c.function.name, c.function.arguments) for c in reply.message.tool_calls or []] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in want.tool_calls or []]
    # A forced call (tool_choice: llamaplug's addition, as OpenAI's) read by the client's own types: the
    # arguments are an object, equal to the JSON text /v1 gives for the same request.
    forced = oai.chat.completions.create(model=name, messages=messages, tools=[TIME_TOOL], max_tokens=64,
                                         temperature=0, tool_choice="required").choices[0].message
    body = {"model": name, "messages": messages, "tools": [TIME_TOOL], "tool_choice": "required", "stream": False,
            "options": options}
    for stream in (False, True):
        got = httpx.post(f"http://127.0.0.1:{port}/api/chat", json={**body, "stream": stream}, headers=AUTH,
                         timeout=300)
        assert got.status_code == 200, got.text
        parts = [ollama.ChatResponse(**json.loads(line)) for line in got.text.splitlines() if line.strip()]
        calls = [c for p in parts for c in p.message.tool_calls or []]
        assert calls and all(isinstance(c.function.arguments, dict) for c in calls)
        assert [(c.function.name, c.function.arguments) for c in calls] == \
            [(c.function.name, json.loads(c.function.arguments)) for c in forced.tool_calls]
        assert parts[-1].done and parts[-1].done_reason == "stop"
    # the call and its result sent back (arguments as an object, the result by tool_name) give a reply
    history = [*messages, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_time", "arguments": {"zone": "Europe/Berlin"}}}]},
        {"role": "tool", "tool_name": "get_time", "content": "noon"}]
    after = client.chat(model=name, messages=history, tools=[TIME_TOOL], options={"temperature": 0,
                                                                               "num_predict": 24})
    assert after.done and (after.message.content or after.message.tool_calls)


def test_suffix_is_fill_in_the_middle_as_infill(port, names):
    """generate's suffix: the model's FIM prompt, as llama-server's /infill lays it out (a 400 where the model has
    no FIM tokens, on both)."""
    for name in names:
        want = httpx.post(f"http://127.0.0.1:{port}/infill", headers=AUTH, timeout=300, json={
            "model": name, "input_prefix": "def add(a, b):\n", "input_suffix": "\n    return c\n", "n_predict": 8,
            "temperature": 0})
        got = httpx.post(f"http://127.0.0.1:{port}/api/generate", headers=AUTH, timeout=300, json={
            "model": name, "prompt": "def add(a, b):\n", "suffix": "\n    return c\n", "stream": False,
            "options": {"temperature": 0, "num_predict": 8}})
        assert got.status_code == want.status_code, (got.text, want.text)
        if want.status_code == 200:
            assert got.json()["response"] == want.json()["content"]
        else:
            assert set(got.json()) == {"error"} and "FIM" in got.json()["error"]


def test_format_json_schema(client, names):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    for name in names:
        reply = client.chat(model=name, messages=[{"role": "user", "content": "Invent a person: name and age."}],
                            format=schema, options={"temperature": 0, "num_predict": 64})
        jsonschema.validate(json.loads(reply.message.content), schema)
        done = client.generate(model=name, prompt="A JSON object:", format="json", raw=True,
                               options={"temperature": 0, "num_predict": 32})
        assert done.response.lstrip().startswith("{")


def test_embed(client, oai, names):
    name = names[0]
    out = client.embed(model=name, input=["a cat", "a dog"])
    want = oai.embeddings.create(model=name, input=["a cat", "a dog"], encoding_format="float")
    want = np.array([d.embedding for d in sorted(want.data, key=lambda d: d.index)])
    assert np.allclose(np.array(out.embeddings), want, atol=1e-5) and out.prompt_eval_count > 0
    one = client.embed(model=name, input="a cat", dimensions=8).embeddings[0]
    assert len(one) == 8 and np.linalg.norm(one) == pytest.approx(1, abs=1e-5)
    assert np.allclose(one, want[0][:8] / np.linalg.norm(want[0][:8]), atol=1e-5)
    legacy = np.array(client.embeddings(model=name, prompt="a cat").embedding)
    assert np.allclose(legacy / np.linalg.norm(legacy), want[0], atol=1e-5)


def test_ps_and_keep_alive_zero_unloads(client, port, names):
    name = names[1]
    client.generate(model=name, prompt="Hi", options={"num_predict": 1})
    running = {m.model: m for m in client.ps().models}
    assert f"{name}:latest" in running and running[f"{name}:latest"].context_length == CTX // SLOTS
    assert states(port)[name] == "loaded"
    client.generate(model=name, prompt="Hi", options={"num_predict": 1}, keep_alive=0)
    wait_for(port, name, "unloaded")
    assert f"{name}:latest" not in {m.model for m in client.ps().models}
    loaded = client.chat(model=name, messages=[])  # no messages: load only
    assert loaded.done_reason == "load" and states(port)[name] == "loaded"
    unloaded = client.generate(model=name, keep_alive=0)  # no prompt, keep_alive 0: unload now
    assert unloaded.done_reason == "unload" and states(port)[name] == "unloaded"
    client.chat(model=name, messages=FRUITS, options={"num_predict": 2}, keep_alive="5m")
    left = (next(m for m in client.ps().models if m.model == f"{name}:latest").expires_at.timestamp() - time.time())
    assert 200 < left <= 300


def test_pull_copy_delete(client, port, tiny):
    lines = list(client.pull(f"hf.co/{HUB_REPO}:Q8_0", stream=True))
    statuses = [p.status for p in lines]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    digest = hashlib.sha256(tiny).hexdigest()
    progress = [p for p in lines if p.digest]
    assert progress and all(p.digest == f"sha256:{digest}" and p.total == len(tiny) for p in progress)
    assert progress[-1].completed == len(tiny)
    name = f"hf.co/{HUB_REPO}:Q8_0"
    assert name in {m.model for m in client.list().models}
    out = client.generate(model=name, prompt="hello", raw=True, options={"num_predict": 4, "temperature": 0})
    assert out.done and out.eval_count == 4
    assert client.pull(f"hf.co/{HUB_REPO}:Q8_0", stream=False).status == "success"  # again: cached, same name
    client.copy(name, "tiny-copy")
    assert {"tiny-copy:latest", name} <= {m.model for m in client.list().models}
    assert client.generate(model="tiny-copy", prompt="hello", raw=True, options={"num_predict": 2}).done
    client.delete("tiny-copy")
    assert "tiny-copy:latest" not in {m.model for m in client.list().models}
    client.delete(name)
    assert name not in {m.model for m in client.list().models}
    with pytest.raises(ollama.ResponseError) as err:
        client.generate(model=name, prompt="hello")
    assert err.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("org/missing:Q8_0", stream=False)
    assert "org/missing" in err.value.error


def test_unknown_model_is_ollamas_404(client, port):
    for call in (lambda: client.chat(model="nope", messages=FRUITS), lambda: client.show("nope:7b"),
                 lambda: client.embed(model="nope", input="x")):
        with pytest.raises(ollama.ResponseError) as err:
            call()
        assert err.value.status_code == 404
    got = httpx.post(f"http://127.0.0.1:{port}/api/chat", json={"model": "nope", "messages": FRUITS}, headers=AUTH)
    assert got.status_code == 404 and got.json() == {"error": "model 'nope' not found"}


@pytest.mark.parametrize("path,body", [
    ("/api/chat", b"{not json"),
    ("/api/chat", {"messages": FRUITS}),
    ("/api/chat", {"model": "M", "messages": "hello"}),
    ("/api/chat", {"model": "M", "messages": [{"role": "wizard", "content": "hi"}]}),
    ("/api/chat", {"model": "M", "messages": FRUITS, "options": {"temperature": "hot"}}),
    ("/api/chat", {"model": "M", "messages": FRUITS, "options": {"top_p": 7}}),
    ("/api/chat", {"model": "M", "messages": FRUITS, "keep_alive": "soon"}),
    ("/api/chat", {"model": "M", "messages": FRUITS, "format": {"type": "nonsense"}}),
    ("/api/generate", {"model": "M", "prompt": "x", "template": "{{ .Prompt }}"}),
    ("/api/chat", {"model": "M", "messages": [{"role": "user", "content": "hi", "images": ["aGVsbG8="]}]}),
    ("/api/embed", {"model": "M", "input": [1, 2]}),
    ("/api/show", {}),
    ("/api/pull", {"model": "not a repo"}),
    ("/api/copy", {"source": "M"}),
])
def test_bad_bodies_are_ollamas_4xx(port, names, path, body):
    if isinstance(body, dict):
        body = json.dumps(body).replace('"M"', json.dumps(names[0])).encode()
    got = httpx.post(f"http://127.0.0.1:{port}{path}", content=body, timeout=60,
                     headers={**AUTH, "Content-Type": "application/json"})
    assert 400 <= got.status_code < 500, got.text
    error = got.json()
    assert set(error) == {"error"} and isinstance(error["error"], str) and error["error"]
    assert httpx.get(f"http://127.0.0.1:{port}/api/version", headers=AUTH).status_code == 200


def test_a_refused_generate_does_not_load_its_model(client, port, names):
    """/api/generate's fields refused whatever the model (template, context, images with raw) are a 400 before
    the model loads (an unloaded model was loaded first, then the request refused)."""
    name = names[1]
    assert client.generate(model=name, keep_alive=0).done_reason == "unload"  # no prompt, keep_alive 0: unload
    for extra in ({"template": "{{ .Prompt }}"}, {"context": [1, 2]}, {"raw": True, "images": ["aGVsbG8="]}):
        got = httpx.post(f"http://127.0.0.1:{port}/api/generate", json={"model": name, "prompt": "x", **extra},
                         headers=AUTH, timeout=60)
        assert got.status_code == 400 and set(got.json()) == {"error"}, got.text
        assert states(port)[name] == "unloaded", extra


def test_the_key_guard_answers_in_ollamas_shape(port, client):
    for path in ("/api/tags", "/api/version"):
        got = httpx.get(f"http://127.0.0.1:{port}{path}")
        assert got.status_code == 401 and set(got.json()) == {"error"}
    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(host=f"http://127.0.0.1:{port}").list()
    assert err.value.status_code == 401
    got = httpx.get(f"http://127.0.0.1:{port}/api/nothing-here", headers=AUTH)
    assert got.status_code == 404 and set(got.json()) == {"error"}
    assert client.list().models  # and the server still serves


# -- the command line: pull, list, show, rm over the Hub cache; ps from the server ------------------------------
def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamaplug.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_cli_pull_list_show_rm(fake_hub, tmp_path, tiny):
    env = {"HF_ENDPOINT": fake_hub.url, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "0",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    pulled = cli("pull", f"{HUB_REPO}:Q8_0", env=env)
    assert pulled.returncode == 0, pulled.stderr
    path = Path(pulled.stdout.strip())
    assert path.read_bytes() == tiny and "pulling tiny-Q8_0.gguf" in pulled.stderr  # the progress bar
    reader = gguf.GGUFReader(str(path))
    heaviest = max(reader.tensors, key=lambda t: int(t.n_bytes)).tensor_type.name
    listed = cli("list", env=env)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["NAME", "SIZE", "QUANTIZATION", "MODIFIED"]
    hub_rows = [r for r in rows if "/" in r.split()[0]]  # (the installed catalog models are listed too)
    assert len(hub_rows) == 1 and hub_rows[0].split()[0] == f"{HUB_REPO}:Q8_0" and heaviest in hub_rows[0].split()
    shown = cli("show", f"{HUB_REPO}:Q8_0", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "architecture" in shown.stdout and reader.fields["general.architecture"].contents() in shown.stdout
    missing = cli("show", "org/nothing:Q8_0", env=env)
    assert missing.returncode == 1 and "org/nothing" in missing.stderr and "Traceback" not in missing.stderr
    removed = cli("rm", f"{HUB_REPO}:Q8_0", env=env)
    assert removed.returncode == 0, removed.stderr
    assert not path.exists() and not [r for r in cli("list", env=env).stdout.splitlines()[1:] if "/" in r.split()[0]]
    assert not list((tmp_path / "hub").glob("models--*"))  # its last file gone, no empty repository folder stays
    again = cli("rm", f"{HUB_REPO}:Q8_0", env=env)
    assert again.returncode == 1 and "not in the Hub cache" in again.stderr


def test_cli_ps_asks_the_server(client, port, names):
    client.generate(model=names[0], prompt="Hi", options={"num_predict": 1}, keep_alive=-1)
    done = cli("ps", "--host", f"127.0.0.1:{port}", "--api-key", KEY)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}
    assert f"{names[0]}:latest" in rows and "Forever" in rows[f"{names[0]}:latest"]
    refused = cli("ps", "--host", str(port))  # a port alone is this machine's (was taken as a host name)
    assert refused.returncode == 1 and "401" in refused.stderr


def test_cli_stop_unloads_as_ollama_stop(client, port, names):
    client.chat(model=names[0], messages=[], keep_alive=-1)  # loaded (no messages: load only), no timer
    assert states(port)[names[0]] == "loaded"
    server = ("--host", f"127.0.0.1:{port}", "--api-key", KEY)
    stopped = cli("stop", f"{names[0]}:latest", *server)
    assert stopped.returncode == 0 and not stopped.stdout, stopped.stderr  # `ollama stop`: silent
    assert states(port)[names[0]] == "unloaded"  # still served: its next request loads it
    unknown = cli("stop", "no-such-model", *server)
    assert unknown.returncode == 1 and "couldn't find model 'no-such-model' to stop" in unknown.stderr
    assert "Traceback" not in unknown.stderr
