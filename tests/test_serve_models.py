"""`llamaplug serve` with several models loaded on demand: a models dir, --max-loaded, keep-alive, the queue.

One real server (SmolLM2 and Gemma-3 from a models dir, --max-loaded 1) is driven by the
`openai` client; the registry's lifecycle rules (one load for concurrent first requests,
LRU, keep-alive, sleep, never closing a model under a request) are also checked with a fake
loader, which makes their timing deterministic.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from email.message import Message
from pathlib import Path
from types import SimpleNamespace

import anthropic
import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient
from llamaplug_testing import THREADS, llamaplug_server

import llamaplug as lp
from llamaplug.errors import InvalidParameterError
from llamaplug.high.engine import EngineStats
from llamaplug.server import durations
from llamaplug.server.app import create_app_for
from llamaplug.server.errors import ApiError
from llamaplug.server.model_specs import specs_from_dir
from llamaplug.server.registry import ModelRegistry, ModelSpec, ModelState, Served

SLOTS = 4
CTX = 2048
MAX_QUEUE = 8  # at most 8 clients wait at once below, so none of theirs is refused


# -- the real server ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, smollm2_path, gemma_path) -> Path:
    folder = tmp_path_factory.mktemp("models")
    (folder / smollm2_path.name).symlink_to(smollm2_path)
    (folder / gemma_path.name).symlink_to(gemma_path)
    (folder / "models.toml").write_text(f'["{gemma_path.name}"]\naliases = ["gemma"]\nn_seq_max = {SLOTS}\n')
    return folder


@pytest.fixture(scope="module")
def server(models_dir):
    with llamaplug_server(None, "--models-dir", str(models_dir), "--max-loaded", "1", "--parallel", str(SLOTS),
                          "-c", str(CTX), "--max-queue", str(MAX_QUEUE), "--seed", "2", "--metrics") as (port, proc):
        # (a fixed seed: a sampled request, the forced tool call below, must not depend on the run)
        yield port, proc


@pytest.fixture(scope="module")
def port(server) -> int:
    return server[0]


@pytest.fixture(scope="module")
def client(port):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def names(smollm2_path, gemma_path) -> tuple[str, str]:
    return smollm2_path.stem, gemma_path.stem  # served as the file's name without .gguf


def states(port: int) -> dict[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as resp:
        return {m["id"]: m["status"]["value"] for m in json.loads(resp.read())["data"]}


def post(port: int, path: str, body: dict, timeout: float = 120) -> tuple[int, Message, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, err.headers, json.loads(err.read())


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def wait_for(port: int, model: str, state: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while states(port)[model] != state:
        assert time.monotonic() < deadline, f"{model} never became {state}: {states(port)}"
        time.sleep(0.05)


def test_a_models_dir_lists_every_model_unloaded(models_dir, names):
    # A server of its own: the module's has loaded models for whichever tests ran before this one.
    with llamaplug_server(None, "--models-dir", str(models_dir), "--max-loaded", "1", "-c", str(CTX)) as (port, _):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == sorted(names)
        assert states(port) == dict.fromkeys(names, "unloaded")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/gemma", timeout=30) as resp:
            assert json.loads(resp.read())["id"] == names[1]  # the alias of models.toml


@pytest.mark.parametrize("which", [0, 1], ids=["smollm2", "gemma3"])
def test_the_openai_client_on_each_model(client, port, names, smollm2_path, gemma_path, which):
    name, path = names[which], (smollm2_path, gemma_path)[which]
    messages = [{"role": "user", "content": "Name three fruits."}]
    with lp.Llama.load(lp.LlamaParams(path, n_ctx=CTX // SLOTS, n_threads=THREADS)) as local:
        want_chat = local.create_chat_completion(messages, max_tokens=12).choices[0].message.content
        want_vectors = local.embed(["a cat", "a dog"], pooling="mean")
    chat = client.chat.completions.create(model=name, messages=messages, max_tokens=12, temperature=0)
    assert chat.model == name and chat.choices[0].message.content == want_chat
    assert states(port) == {name: "loaded", names[1 - which]: "unloaded"}  # --max-loaded 1
    streamed = client.chat.completions.create(model=name, messages=messages, max_tokens=12, temperature=0,
                                              stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == want_chat
    text = client.completions.create(model=name, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert text.model == name and text.choices[0].finish_reason == "length"
    streamed = client.completions.create(model=name, prompt="The capital of France is", max_tokens=8,
                                         temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text.choices[0].text
    out = client.embeddings.create(model=name, input=["a cat", "a dog"], encoding_format="float")
    got = np.array([d.embedding for d in sorted(out.data, key=lambda d: d.index)])
    assert np.allclose(got, want_vectors, atol=1e-5)


@pytest.mark.parametrize("which", [0, 1], ids=["smollm2", "gemma3"])
def test_the_responses_and_anthropic_clients_on_each_model(client, port, names, which):
    """The two other client APIs pick their model from the same registry: Responses and Messages, whole and
    streamed, and a tool call, with the text of the same conversation through /v1/chat/completions."""
    name = names[which]
    messages = [{"role": "user", "content": "Name three fruits."}]
    want = client.chat.completions.create(model=name, messages=messages, max_tokens=12,
                                          temperature=0).choices[0].message.content
    got = client.responses.create(model=name, input="Name three fruits.", max_output_tokens=12, temperature=0)
    assert got.model == name and got.output_text == want
    events = client.responses.create(model=name, input="Name three fruits.", max_output_tokens=12, temperature=0,
                                     stream=True)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want
    claude = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="unused", max_retries=0)
    reply = claude.messages.create(model=name, max_tokens=12, messages=messages, extra_body={"temperature": 0})
    assert reply.model == name and reply.content[0].text == want
    with claude.messages.stream(model=name, max_tokens=12, messages=messages, extra_body={"temperature": 0}) as s:
        assert "".join(s.text_stream) == want
    weather = {"name": "get_weather", "description": "Weather in a city",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    # Neither model's own template has a place for tools: refused in Anthropic's shape (llama-server would go on
    # without them), not dropped.
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model=name, max_tokens=48, tools=[weather],
                               tool_choice={"type": "tool", "name": "get_weather"},
                               messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "no place for tools" in refused.value.body["error"]["message"]
    assert states(port)[name] == "loaded"


def test_an_unknown_model_is_a_404_in_each_apis_shape(client, port):
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="no-such-model", input="x", max_output_tokens=1)
    assert err.value.body["param"] == "model"
    claude = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="unused", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as aerr:
        claude.messages.create(model="no-such-model", max_tokens=1, messages=[{"role": "user", "content": "x"}])
    assert aerr.value.body["error"]["type"] == "not_found_error"
    status, _, body = post(port, "/completion", {"model": "no-such-model", "prompt": "x", "n_predict": 1})
    assert status == 404 and set(body["error"]) >= {"code", "message", "type"}  # llama-server's shape


def test_eight_clients_alternating_two_models_swap_them_within_one_models_memory(client, server, names):
    port, proc = server
    small, big = names
    for name in (small, big, small):  # each loaded once before the baseline: what a first load leaves is counted
        client.completions.create(model=name, prompt="Hello", max_tokens=8, temperature=0)
    one_model = rss_mib(proc.pid)
    seen: list[dict[str, str]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(states(port))
            time.sleep(0.02)

    def ask(k: int) -> list[str]:
        return [client.completions.create(model=names[(k + j) % 2], prompt=f"Fact {k}.{j}:", max_tokens=8,
                                          temperature=0).model for j in range(2)]

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            answered = [m for ms in pool.map(ask, range(8)) for m in ms]  # an error (4xx, 5xx) raises here
    finally:
        done.set()
        watcher.join()
    assert sorted(answered) == sorted(names * 8)
    assert all(list(s.values()).count("loaded") <= 1 for s in seen), "--max-loaded 1 held two models"
    assert {s[small] for s in seen} >= {"loaded", "unloaded"} and {s[big] for s in seen} >= {"loaded", "unloaded"}
    assert any("loading" in s.values() for s in seen)
    client.completions.create(model=small, prompt="Hello", max_tokens=8, temperature=0)
    after = rss_mib(proc.pid)
    assert after <= 1.10 * one_model, f"{after:.0f} MiB after the swaps, {one_model:.0f} MiB with one model"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        lines = dict(line.rsplit(" ", 1) for line in resp.read().decode().splitlines() if line[:1] != "#")
    per_model = [int(lines[f'llamaplug_requests_total{{model="{n}"}}']) for n in names]
    assert min(per_model) >= 8 and sum(per_model) == int(lines["llamaplug_requests_total"])


def test_a_load_is_listed_as_loading_and_waits_for_the_running_request(port, names):
    small, big = names
    post(port, "/models/load", {"model": small})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": small, "prompt": "Count from 1 to 1000: 1, 2, 3,",
                                                        "max_tokens": 2000, "stream": True, "temperature": 0}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.readline().startswith(b"data: ")  # the request runs (for seconds: 2000 tokens)
    loading = ThreadPoolExecutor(1).submit(post, port, "/models/load", {"model": big})
    wait_for(port, big, "loading")
    for _ in range(10):  # --max-loaded 1: big waits, and small is not unloaded under its request
        assert states(port) == {small: "loaded", big: "loading"}
        time.sleep(0.05)
    conn.sock.close()  # the client goes: its request ends, and the load goes on
    conn.close()
    status, _, card = loading.result(timeout=60)
    assert status == 200 and card["status"] == {"value": "loaded"} and card["id"] == big
    assert states(port) == {small: "unloaded", big: "loaded"}


def test_a_dropped_stream_releases_its_model(port, names):
    small, _ = names
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": small, "prompt": "Count: 1, 2, 3,",
                                                        "max_tokens": 2000, "stream": True, "temperature": 0}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    for _ in range(3):
        assert resp.readline()
    conn.sock.close()
    conn.close()
    status, _, card = post(port, "/models/unload", {"model": small}, timeout=30)  # waits for the request's end
    assert status == 200 and card["status"] == {"value": "unloaded"}


def test_load_unload_and_unknown_models(client, port, names):
    small, big = names
    status, _, card = post(port, "/models/load", {"model": "gemma"})
    assert status == 200 and card["id"] == big and states(port)[big] == "loaded"
    status, _, card = post(port, "/models/unload", {"model": big})
    assert status == 200 and states(port) == {small: "unloaded", big: "unloaded"}
    for path in ("/models/load", "/models/unload"):
        status, _, body = post(port, path, {"model": "no-such-model"})
        assert status == 404 and body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"
        status, _, body = post(port, path, {"modle": small})
        assert status == 400 and body["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_keep_alive_zero_unloads_after_the_request(client, port, names):
    small, _ = names
    out = client.completions.create(model=small, prompt="Hi", max_tokens=2, extra_body={"keep_alive": 0})
    assert out.choices
    wait_for(port, small, "unloaded", seconds=10)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=small, prompt="Hi", max_tokens=2, extra_body={"keep_alive": "soon"})
    assert err.value.body["param"] == "keep_alive"
    client.completions.create(model=small, prompt="Hi", max_tokens=2, extra_body={"keep_alive": "-1"})
    assert states(port)[small] == "loaded"


def test_a_full_queue_is_503_with_retry_after(port, names):
    _, big = names
    post(port, "/models/unload", {"model": big})  # not loaded, whatever ran before: every request waits for its load
    assert states(port)[big] == "unloaded"
    body = {"model": big, "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}
    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(lambda _: post(port, "/v1/completions", body), range(24)))
    refused = [(h, b) for s, h, b in answers if s == 503]
    assert all(s in (200, 503) for s, _, _ in answers)
    assert len(refused) >= 24 - MAX_QUEUE - SLOTS
    assert all(h.get("Retry-After") == "1" and b["error"]["code"] == "queue_full"
               and b["error"]["type"] == "server_error" for h, b in refused)
    assert client_ok(port, big)  # the server goes on


def client_ok(port: int, model: str) -> bool:
    status, _, body = post(port, "/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 2})
    return status == 200 and bool(body["choices"])


# -- the app without a server ---------------------------------------------------------------------------------
def test_the_api_key_guards_every_path_but_health(smollm2_path):
    registry = ModelRegistry(specs=[ModelSpec("m", lp.LlamaParams(smollm2_path))])
    with TestClient(create_app_for(registry, api_key="k")) as http_client:
        for method, path in (("GET", "/v1/models"), ("POST", "/models/load"), ("POST", "/models/unload"),
                             ("GET", "/metrics")):
            resp = http_client.request(method, path, json={"model": "m"})
            assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key", path
        assert http_client.get("/health").status_code == 200
        assert http_client.get("/").status_code == 200  # the chat page, which asks for the key itself
        listed = http_client.get("/v1/models", headers={"Authorization": "Bearer k"}).json()["data"]
        assert listed == [{"id": "m", "object": "model", "created": listed[0]["created"], "owned_by": "llamaplug",
                           "aliases": [], "tags": [], "status": {"value": "unloaded"},
                           "capabilities": ["completion"]}]


@pytest.mark.parametrize("toml, where", [
    ('["M.gguf"]\nn_ctx = "big"\n', "n_ctx"),
    ('["M.gguf"]\ncontext = 5\n', "context"),
    ('["M.gguf"]\naliases = "x"\n', "aliases"),
    ('["Other.gguf"]\nn_ctx = 512\n', "Other.gguf"),
    ('["M.gguf"\n', "not valid TOML"),
], ids=["wrong_type", "unknown_key", "aliases_not_a_list", "no_such_file", "not_toml"])
def test_a_bad_models_toml_names_its_file_and_key(tmp_path, smollm2_path, toml, where):
    (tmp_path / "M.gguf").symlink_to(smollm2_path)
    (tmp_path / "models.toml").write_text(toml)
    with pytest.raises(InvalidParameterError) as err:
        specs_from_dir(tmp_path, {})
    assert str(tmp_path / "models.toml") in str(err.value) and where in str(err.value)


def test_models_toml_gives_a_models_own_settings(tmp_path, smollm2_path):
    (tmp_path / "M.gguf").symlink_to(smollm2_path)
    (tmp_path / "mmproj-M.gguf").symlink_to(smollm2_path)  # a projector, not a model
    (tmp_path / "models.toml").write_text('["M.gguf"]\nn_ctx = 512\nn_seq_max = 2\naliases = ["m"]\n'
                                          'chat_template = "chatml"\n')
    (spec,) = specs_from_dir(tmp_path, {"n_ctx": 4096, "n_threads": 2})
    assert (spec.id, spec.aliases, spec.chat_template) == ("M", ("m",), "chatml")
    assert (spec.params.n_ctx, spec.params.n_seq_max, spec.params.n_threads) == (512, 2, 2)


# -- the lifecycle with a fake loader ---------------------------------------------------------------------------
class FakeLlama:
    def __init__(self, params: lp.LlamaParams):
        self.params = params
        self.engine = SimpleNamespace(n_slots=1, stats=EngineStats(), failure=None, on_stop=lambda hook: None)
        self.model = SimpleNamespace(metadata={})
        self.context = SimpleNamespace(backend_lost=None)
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Loader:
    """Records loads; each waits for `gate` (a test opens it when it wants the load to end)."""

    def __init__(self) -> None:
        self.loads: list[Path] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, params: lp.LlamaParams) -> FakeLlama:
        self.loads.append(params.model_path)
        assert self.gate.wait(10)
        return FakeLlama(params)


def fake_registry(smollm2_path, loader: Loader, **options) -> ModelRegistry:
    specs = [ModelSpec(n, lp.LlamaParams(smollm2_path), (f"{n}-alias",)) for n in ("a", "b", "c")]
    return ModelRegistry(specs=specs, loader=loader, **options)


def test_concurrent_first_requests_share_one_load_and_lru_unloads(smollm2_path):
    loader = Loader()
    registry = fake_registry(smollm2_path, loader, max_loaded=2)

    async def use(name: str, hold: asyncio.Event | None = None, held: asyncio.Event | None = None) -> str:
        async with registry.lease(name) as served:
            if held is not None:
                held.set()
            if hold is not None:
                await hold.wait()  # the lease is kept until the test says
            return served.id

    async def main() -> None:
        loader.gate.clear()
        tasks = [asyncio.ensure_future(use("a")) for _ in range(5)] + [asyncio.ensure_future(use("a-alias"))]
        await _until(lambda: registry.describe("a")[1] is ModelState.LOADING, "a's load never began")
        loader.gate.set()
        assert await asyncio.gather(*tasks) == ["a"] * 6
        assert len(loader.loads) == 1  # six requests, one load
        await use("b")
        await use("a")  # b is now the least recently used
        await use("c")
        assert [registry.describe(n)[1] for n in "abc"] == [ModelState.LOADED, ModelState.UNLOADED,
                                                            ModelState.LOADED]
        # b's load must unload a or c; a is in use, so c goes, even though a was used earlier
        release, held = asyncio.Event(), asyncio.Event()
        holder = asyncio.ensure_future(use("a", hold=release, held=held))
        await held.wait()
        await use("b")
        assert registry.describe("c")[1] is ModelState.UNLOADED and not holder.done()
        release.set()
        await holder

    asyncio.run(main())


def test_a_model_is_never_closed_under_a_request(smollm2_path):
    loader = Loader()
    registry = fake_registry(smollm2_path, loader, max_loaded=1)

    async def main() -> None:
        async with registry.lease("a") as a:
            other = asyncio.ensure_future(registry.load("b"))
            await _until(lambda: registry.describe("b")[1] is ModelState.LOADING, "b's load never began")
            for _ in range(50):  # turns of the loop in which a wrong unload of a would happen
                await asyncio.sleep(0)
            assert not a.llama.closed and registry.describe("b")[1] is ModelState.LOADING
        await other
        assert a.llama.closed and registry.describe("a")[1] is ModelState.UNLOADED

    asyncio.run(main())


def test_a_model_that_lost_its_rpc_server_is_loaded_again_after_its_requests(smollm2_path):
    loader = Loader()
    registry = fake_registry(smollm2_path, loader)

    async def use(name: str) -> Served:
        async with registry.lease(name) as served:
            return served

    async def main() -> None:
        async with registry.lease("a") as first:
            first.llama.context.backend_lost = "127.0.0.1:50052"  # as a decode that lost it marks the context
            later = asyncio.ensure_future(use("a"))
            await asyncio.sleep(0.1)
            assert not first.llama.closed and not later.done()  # never closed under a request
        second = await later
        assert first.llama.closed and second.llama is not first.llama and len(loader.loads) == 2
        assert registry.describe("a")[1] is ModelState.LOADED and (await use("a")) is second

    asyncio.run(main())


async def _until(condition, what: str) -> None:
    """Wait for `condition()` on the loop; the deadline only ends a hang."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


def test_keep_alive_sleep_idle_and_the_queue(smollm2_path):
    """Which timer a request leaves behind is read from the registry (expires_in), not guessed from sleeps;
    the state changes are then waited for."""
    loader = Loader()
    registry = fake_registry(smollm2_path, loader, keep_alive=0.1, sleep_idle=0.05, max_queue=1)

    async def main() -> None:
        async with registry.lease("a"):
            pass
        assert registry.expires_in("a") <= 0.05  # the shorter of the two: sleep
        await _until(lambda: registry.describe("a")[1] is ModelState.SLEEPING, "a never slept")
        async with registry.lease("a", keep_alive=-1):  # negative: never, this model from now on
            pass
        assert registry.describe("a")[1] is ModelState.LOADED and registry.expires_in("a") is None  # no timer
        async with registry.lease("b", keep_alive=0):
            pass
        assert registry.expires_in("b") == 0  # unloaded right after the request, not after the server's 0.1 s
        await _until(lambda: registry.describe("b")[1] is ModelState.UNLOADED, "b was never unloaded")
        loader.gate.clear()
        first = asyncio.ensure_future(registry.load("c"))
        await _until(lambda: registry.describe("c")[1] is ModelState.LOADING, "c's load never began")
        with pytest.raises(ApiError) as err:  # one request already waits for c's load
            async with registry.lease("c"):
                pass
        assert err.value.status == 503 and err.value.headers == {"Retry-After": "1"}
        loader.gate.set()
        await first

    asyncio.run(main())


@pytest.mark.parametrize("text, seconds", [("300", 300), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25),
                                           ("-1", -1), ("-5m", -300), ("1.5s", 1.5), (0, 0)])
def test_durations_as_ollamas_keep_alive(text, seconds):
    assert durations.seconds(text) == seconds


@pytest.mark.parametrize("text", ["soon", "5 m", "m", "", "5d", True])
def test_a_bad_duration_is_refused(text):
    with pytest.raises(ValueError):
        durations.seconds(text)
