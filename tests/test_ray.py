"""Scale-out on Ray Serve (llamaplug.integrations.ray): a local two-node Ray cluster, two replicas, one ingress.

The cluster tests (marker `ray`) share ONE cluster, started here as two `ray start --block`
processes (a head with 2 CPUs, a second node with 1) and torn down at the end, and ONE
deployment of two replicas (1 CPU, so 1 thread, each). They check the answers against
`llamaplug serve` (the same engine alone, driven by the same `openai` client), the
prefix routing by the replicas' own cache counters, a client leaving a stream, and a
replica killed under load. The routing key, the ring and the ASGI bridge are tested
without a cluster.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait

import openai
import psutil
import pytest
from llamaplug_testing import free_port, llamaplug_server

from llamaplug.integrations.affinity import HashRing, affinity_key, prompt_text
from llamaplug.integrations.asgi_bridge import Forwarded, Head, answer

try:
    import ray
    from ray import serve
except ImportError:  # the tests that need no Ray still run
    ray = serve = None

SLOTS = 4
CTX = 4096
APP = "llamaplug"


# -- without a cluster ------------------------------------------------------------------------------------------------

def test_the_key_is_the_prompts_first_characters():
    system = "You are a librarian. " * 20
    a = json.dumps({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "one"}]}).encode()
    b = json.dumps({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "two"}]}).encode()
    c = json.dumps({"messages": [{"role": "system", "content": "Other. " + system}]}).encode()
    path = "/v1/chat/completions"
    assert affinity_key(path, a) == affinity_key(path, b) != affinity_key(path, c)
    assert affinity_key(path, a, chars=len(system) + 100) != affinity_key(path, b, chars=len(system) + 100)
    assert prompt_text("/v1/completions", json.dumps({"prompt": ["first", "second"]}).encode()) == "first"
    for path, body in (("/v1/models", b""), ("/v1/completions", b"{not json"), ("/v1/completions", b"[1]")):
        assert affinity_key(path, body) is None


def test_the_ring_moves_only_the_keys_of_a_replica_that_leaves():
    keys = [affinity_key("/v1/completions", json.dumps({"prompt": f"family {i}"}).encode()) for i in range(400)]
    three, two = HashRing(["a", "b", "c"]), HashRing(["a", "b"])
    owners = [three.owner(k) for k in keys]
    assert {o: owners.count(o) for o in "abc"} == pytest.approx({o: len(keys) / 3 for o in "abc"}, rel=0.35)
    assert all(two.owner(k) == o for k, o in zip(keys, owners) if o != "c")
    assert HashRing([]).owner(keys[0]) is None


def test_the_bridge_relays_an_asgi_answer_and_a_disconnect():
    sent: list[str] = []

    async def app(scope, receive, send):
        assert (await receive())["body"] == b"hello"
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"99")]})
        for part in (b"a", b"b"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        sent.append("waiting")
        assert (await receive())["type"] == "http.disconnect"
        sent.append("told")

    async def run():
        items = answer(app, Forwarded("POST", "/x", body=b"hello"), ((b"x-tag", b"1"),))
        head = await items.__anext__()
        assert [await items.__anext__(), await items.__anext__()] == [b"a", b"b"]
        await items.aclose()  # the client leaves
        return head

    head = asyncio.run(run())
    assert isinstance(head, Head) and head.status == 201
    assert head.headers == ((b"content-type", b"text/plain"), (b"x-tag", b"1"))  # the length is the relay's to set
    assert sent == ["waiting", "told"]


def test_a_stream_whose_replica_dies_ends_with_its_apis_error_event_in_plain_words():
    """The ingress's end of a stream cut by a lost replica (the killed-replica test below, on a cluster): its API's
    error event, with no Ray class in its message (was "... was lost: ActorDiedError")."""
    if ray is None:
        pytest.skip('needs Ray: pip install "llamaplug[ray]"')
    from llamaplug.integrations.ray import STOPPED, _rest

    class Dying:  # a Serve streaming handle's answer whose actor dies after one chunk
        def __init__(self):
            self.chunks, self.cancelled = [b"data: {}\n\n"], False

        def __aiter__(self):
            return self

        async def __anext__(self):
            if self.chunks:
                return self.chunks.pop()
            raise ray.exceptions.ActorDiedError()

        def cancel(self):
            self.cancelled = True

    async def read(path):
        stream = Dying()
        chunks = [chunk async for chunk in _rest(stream, b"data: {}\n\n", path)]
        assert stream.cancelled and chunks[:2] == [b"data: {}\n\n"] * 2
        return chunks[2].decode()

    openai_end = asyncio.run(read("/v1/completions"))
    assert openai_end.endswith("\n\ndata: [DONE]\n\n")
    assert json.loads(openai_end.split("\n")[0].removeprefix("data: "))["error"] == {
        "message": STOPPED, "type": "server_error", "param": None, "code": "closed"}
    for path, where in (("/v1/messages", "error"), ("/v1/responses", None)):  # Anthropic's, the Responses API's
        kind, data = asyncio.run(read(path)).split("\n")[:2]
        event = json.loads(data.removeprefix("data: "))
        assert kind == "event: error" and (event[where] if where else event)["message"] == STOPPED


def test_serve_ray_without_ray_says_what_to_install(smollm2_path):
    code = ("import sys; sys.modules['ray'] = None; from llamaplug.cli import main; "
            f"sys.exit(main(['serve', '--ray', '-m', {str(smollm2_path)!r}, '-c', '512']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert 'pip install "llamaplug[ray]"' in done.stderr and "Traceback" not in done.stderr


def test_app_builders_check_what_they_are_given(smollm2_path, tmp_path):
    if ray is None:
        pytest.skip('needs Ray Serve: pip install "llamaplug[ray]"')
    from llamaplug import InvalidParameterError
    from llamaplug.integrations.ray import app_from_args, build_app

    assert isinstance(app_from_args({"model": str(smollm2_path), "replicas": "2", "threads": "1"}), serve.Application)
    for call, field in ((lambda: app_from_args({"replicas": "2"}), "model"),
                        (lambda: build_app(smollm2_path, routing="random"), "routing"),
                        (lambda: build_app(tmp_path), "source"), (lambda: build_app(42), "source")):
        with pytest.raises(InvalidParameterError) as err:
            call()
        assert err.value.field == field


# -- the cluster ------------------------------------------------------------------------------------------------------



# A loopback cluster of the test's own: no usage report, and no token (Ray 2.60 turns token auth on when it finds
# ~/.ray/auth_token, which a local `ray.init()` leaves behind; the second node would need the same token).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _ray(*args: str) -> subprocess.Popen:
    # Its own process group: the teardown ends this cluster's processes and no other.
    return subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--block", *args],
                            env={**os.environ, **RAY_ENV}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.fixture(scope="module")
def cluster():
    """A head (2 CPUs) and a second node (1 CPU) on this machine; yields the address. Ended at the module's end."""
    if ray is None:
        pytest.skip('needs Ray Serve: pip install "llamaplug[ray]"')
    with pytest.MonkeyPatch.context() as env:
        for name, value in RAY_ENV.items():
            env.setenv(name, value)  # for this process's driver, and the CLI's
        yield from _cluster()


def _cluster():
    port = free_port()
    address = f"127.0.0.1:{port}"
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    starts = [_ray("--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                   "--disable-usage-stats", f"--temp-dir={temp}")]
    try:
        starts.append(_ray(f"--address={address}", "--num-cpus=1"))
        deadline = time.monotonic() + 120
        while True:
            try:
                ray.init(address=address, log_to_driver=False, logging_level="warning")
                break
            except (ConnectionError, RuntimeError):
                if time.monotonic() > deadline or any(p.poll() is not None for p in starts):
                    ended = [p.stderr.read()[-2000:] for p in starts if p.poll() is not None]
                    pytest.fail(f"the Ray cluster did not start: {ended}")
                time.sleep(1)
        while ray.cluster_resources().get("CPU", 0) < 3:
            assert time.monotonic() < deadline, f"the second node did not join: {ray.cluster_resources()}"
            time.sleep(0.5)
        yield address
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        processes = []
        for start in starts:
            try:
                processes += [start, *psutil.Process(start.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        for start in starts:
            if start.poll() is None:
                os.killpg(start.pid, signal.SIGKILL)
        for proc in processes:  # workers have process groups of their own
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs([p for p in processes if isinstance(p, psutil.Process)], timeout=10)
        for start in starts:
            start.wait(timeout=10)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_cache(tmp_path_factory):
    """The replicas' shared prompt cache directory (serve --cache-dir): both run on this one machine."""
    return tmp_path_factory.mktemp("ray-cache")


@pytest.fixture(scope="module")
def ingress(cluster, smollm2_path, ray_cache):
    """Two replicas of SmolLM2 (1 CPU: 1 thread each, SLOTS slots) behind the ingress; yields its port."""
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    _deploy(smollm2_path, ray_cache)
    return port


def _deploy(smollm2_path, cache_dir) -> None:
    """The module's app: two replicas of SmolLM2 on one cache directory (the CLI test replaces it and puts it back)."""
    from llamaplug import LlamaParams
    from llamaplug.integrations.ray import build_app

    params = LlamaParams(smollm2_path, n_ctx=CTX, n_seq_max=SLOTS, cache_dir=cache_dir)
    serve.run(build_app(params, num_replicas=2), name=APP)


@pytest.fixture(scope="module")
def plain(smollm2_path):
    """`llamaplug serve` of the same model and slots, 1 thread: the reference answers and the one-engine figures."""
    with llamaplug_server(smollm2_path, "--parallel", str(SLOTS), "-c", str(CTX), "-t", "1", "--metrics") as (port, _):
        yield port


def _client(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)


def _metrics(port: int, replica: str | None = None) -> dict[str, float]:
    from llamaplug.integrations.ray import REPLICA_HEADER

    pin = {REPLICA_HEADER: replica} if replica else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=pin)
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read().decode()
    return {k: float(v) for k, v in (line.split() for line in text.splitlines() if line and line[0] != "#")}


def _post(port: int, path: str, body: dict, timeout: float = 120,
          replica: str | None = None) -> tuple[int, dict, str | None]:
    from llamaplug.integrations.ray import REPLICA_HEADER

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        pin = {REPLICA_HEADER: replica} if replica else {}
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **pin})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read()), resp.getheader("x-llamaplug-replica")
    finally:
        conn.close()


@pytest.mark.ray
def test_the_openai_client_gets_llamaplug_serves_greedy_text(ingress, plain):
    ray_client, ref = _client(ingress), _client(plain)
    model = ref.models.list().data[0].id
    assert [m.id for m in ray_client.models.list().data] == [model]
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three fruits."}]
    want = ref.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
    got = ray_client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert (got.choices[0].finish_reason, got.usage.prompt_tokens) == (want.choices[0].finish_reason,
                                                                         want.usage.prompt_tokens)
    streamed = list(ray_client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0,
                                                       stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == want.choices[0].message.content
    prompts = ["The capital of France is", "def square(x):"]
    want_texts = [ref.completions.create(model=model, prompt=p, max_tokens=12, temperature=0).choices[0].text
                  for p in prompts]
    assert [ray_client.completions.create(model=model, prompt=p, max_tokens=12, temperature=0).choices[0].text
            for p in prompts] == want_texts
    assert "".join(c.choices[0].text for c in ray_client.completions.create(
        model=model, prompt=prompts[1], max_tokens=12, temperature=0, stream=True)) == want_texts[1]


@pytest.mark.ray
# (An unknown model is no error with one model served: it answers to any name, as llama-server.)
@pytest.mark.parametrize("body", [{"prompt": "x", "max_tokens": "many"}, {"prompt": "x", "max_tokens": -1},
                                  {"prompt": [1, 2, 10**9], "max_tokens": 1}],
                         ids=["wrong_type", "negative", "vocab"])
def test_errors_have_llamaplug_serves_status_and_shape(ingress, plain, body):
    status, error, _ = _post(ingress, "/v1/completions", body)
    assert (status, error) == _post(plain, "/v1/completions", body)[:2]


def _families(n_families: int = 4, per_family: int = 8) -> list[str]:
    """Prompts of `n_families` families: a long shared preamble each (longer than the routing key), then a question."""
    topics = ["the sea", "mountains", "old clocks", "bread"]
    preambles = [f"Notes on {topics[f]}, family {f}. " + " ".join(f"Fact {i} about {topics[f]} is worth knowing."
                                                                  for i in range(10)) for f in range(n_families)]
    return [f"{preambles[f]} Question {q}: what is fact {q}?" for q in range(per_family) for f in range(n_families)]


def _cache_ratio(port: int, replicas: list[str | None]) -> float:
    """Send the families (4 at a time) and give cached/prompt tokens over the run, from the engines' counters."""
    before = [_metrics(port, r) for r in replicas]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: _post(port, "/v1/completions", {"prompt": p, "max_tokens": 2}),
                                _families()))
    assert all(status == 200 for status, _, _ in results)
    after = [_metrics(port, r) for r in replicas]
    cached = sum(a["llamaplug_cached_tokens_total"] - b["llamaplug_cached_tokens_total"] for a, b in zip(after, before))
    prompt = sum(a["llamaplug_prompt_tokens_total"] - b["llamaplug_prompt_tokens_total"] for a, b in zip(after, before))
    return cached / prompt


def _replicas(port: int) -> list[str]:
    """The replicas' ids, as they answer (different prompts land on both)."""
    seen: set[str] = set()
    for i in range(16):
        seen.add(_post(port, "/v1/completions", {"prompt": f"Replica probe {i}", "max_tokens": 1})[2])
        if len(seen) == 2:
            break
    return sorted(seen)


@pytest.mark.ray
def test_prompts_sharing_a_prefix_find_their_cache(ingress, plain):
    one = _cache_ratio(plain, [None])
    two = _cache_ratio(ingress, _replicas(ingress))
    print(f"cached/prompt tokens: one engine {one:.3f}, two replicas with prefix routing {two:.3f}")
    assert one > 0.5  # the families share most of their prompts
    assert two >= 0.8 * one


@pytest.mark.ray
def test_replicas_on_one_machine_share_the_disk_cache(ingress, ray_cache):
    """A long prompt one replica read is written to the shared directory; the other replica, asked the same prompt,
    loads it from there instead of reading it (issue 46: replicas share `--cache-dir`)."""
    first, second = _replicas(ingress)
    prompt = "Harbour log. " + " ".join(f"Entry {i}: the boat number {i} came in at dawn." for i in range(60))
    before = _metrics(ingress, second)
    status, reply, answered = _post(ingress, "/v1/completions", {"prompt": prompt, "max_tokens": 1}, replica=first)
    assert (status, answered) == (200, first) and reply["usage"]["prompt_tokens"] >= 600
    deadline = time.monotonic() + 60
    while not any(ray_cache.glob("*.kv")):  # written after a long prefill
        assert time.monotonic() < deadline, "the first replica wrote no cache file"
        time.sleep(0.2)
    status, again, answered = _post(ingress, "/v1/completions", {"prompt": prompt, "max_tokens": 1}, replica=second)
    after = _metrics(ingress, second)
    assert (status, answered) == (200, second)
    assert after["llamaplug_cache_disk_hits_total"] - before["llamaplug_cache_disk_hits_total"] >= 1
    assert after["llamaplug_cached_tokens_total"] - before["llamaplug_cached_tokens_total"] >= 512


@pytest.mark.ray
def test_a_client_leaving_a_stream_frees_its_replicas_slot(ingress):
    conn = http.client.HTTPConnection("127.0.0.1", ingress, timeout=60)
    body = {"prompt": "Count from 1 to 1000: 1, 2, 3,", "max_tokens": 2000, "stream": True, "temperature": 0}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    replica = resp.getheader("x-llamaplug-replica")
    assert resp.status == 200 and replica
    for _ in range(3):
        assert resp.fp.readline()
    assert _metrics(ingress, replica)["llamaplug_slots_busy"] == 1
    conn.sock.close()
    conn.close()
    deadline = time.monotonic() + 30
    while _metrics(ingress, replica)["llamaplug_slots_busy"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _metrics(ingress, replica)["llamaplug_slots_busy"] == 0


def _stream(port: int, prompt: str) -> tuple[int, list[dict]]:
    """A streamed completion read to its end: the status and the events' JSON (the last one is [DONE]'s None)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=90)
    try:
        conn.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": 48, "stream": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return resp.status, [json.loads(resp.read())]
        events: list[dict] = []
        for line in resp:
            if line.startswith(b"data: "):
                events.append(None if line.strip() == b"data: [DONE]" else json.loads(line[6:]))
        return 200, events
    finally:
        conn.close()


def _replica_pids() -> set[int]:
    return {p.pid for p in psutil.process_iter(["cmdline"])
            if any(f"ServeReplica:{APP}:LlamaReplica" in part for part in (p.info["cmdline"] or []))}


@pytest.mark.ray
def test_a_killed_replica_costs_only_its_requests_and_comes_back(ingress):
    from llamaplug.integrations.ray import STOPPED

    before = _replicas(ingress)
    pids = _replica_pids()
    assert len(before) == 2 and len(pids) == 2
    prompts = [f"Story {i}: once upon a time" for i in range(12)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        plain_ones = [pool.submit(_post, ingress, "/v1/completions", {"prompt": p, "max_tokens": 48}, 90)
                      for p in prompts[:8]]
        streams = [pool.submit(_stream, ingress, p) for p in prompts[8:]]
        time.sleep(2)  # both replicas are busy
        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        _, hung = wait(plain_ones + streams, timeout=120)
    assert not hung
    # Each ended (a client's timeout would raise here): with an answer, or with OpenAI's error shape.
    failed = [body for status, body, _ in (f.result() for f in plain_ones) if status != 200]
    for body in failed:
        assert body["error"]["code"] == "replica_unavailable" and body["error"]["type"] == "server_error"
        assert "Error" not in body["error"]["message"], body  # plain words, no Ray class (was ActorDiedError)
    for status, events in (f.result() for f in streams):
        assert status == 200 and events[-1] is None  # [DONE]
        if "error" in events[-2]:  # cut: the status line was out when its replica died
            failed.append(events[-2])
            assert events[-2]["error"]["type"] == "server_error"
            assert events[-2]["error"]["message"] == STOPPED  # (was "... was lost: ActorDiedError")
        else:  # a normal end: these requests sample at the server's default temperature, so EOS may come first
            assert events[-2]["choices"][0]["finish_reason"] in ("length", "stop")
    print(f"replica {victim} killed under {len(prompts)} requests: {len(failed)} failed")
    assert len(failed) <= SLOTS  # only what the killed replica held; the others were retried on the survivor
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = serve.status().applications[APP].deployments["LlamaReplica"]
        if status.replica_states.get("RUNNING") == 2 and len(_replica_pids() - {victim}) == 2:
            break
        time.sleep(1)
    after = _replicas(ingress)
    assert len(after) == 2 and len(set(after) - set(before)) == 1  # a new replica serves beside the survivor
    assert victim not in _replica_pids()


@pytest.mark.ray
def test_llamaplug_serve_ray_deploys_on_a_cluster(cluster, ingress, plain, smollm2_path, ray_cache):
    """The CLI on the running cluster: it replaces the app with its own (1 replica), served where Serve listens."""
    proc = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "serve", "--ray", "--ray-address", cluster,
                             "--replicas", "1", "-m", str(smollm2_path), "-c", str(CTX), "-np", str(SLOTS),
                             "--alias", "via-cli"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the CLI's app did not come up"
            try:
                if [m.id for m in _client(ingress).models.list().data] == ["via-cli"]:
                    break
            except openai.APIError:
                pass
            time.sleep(1)
        want = _client(plain).completions.create(model=_client(plain).models.list().data[0].id,
                                                 prompt="Snow is", max_tokens=12, temperature=0).choices[0].text
        got = _client(ingress).completions.create(model="via-cli", prompt="Snow is", max_tokens=12, temperature=0)
        assert got.choices[0].text == want
    finally:
        proc.send_signal(signal.SIGTERM)  # as an orchestrator stops it (Ctrl-C the same): the CLI deletes its app
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
        _deploy(smollm2_path, ray_cache)  # the module's two replicas again, for the tests that run after this one
    assert code == 0, proc.stderr.read()[-3000:]  # was 134: Ray's C handler aborted the driver
    # serve.run returns once the app runs; the ingress's router may hear of the second replica a moment later (on
    # the loaded 2-core machine all 16 probes once went to the first)
    deadline = time.monotonic() + 60
    while len(_replicas(ingress)) < 2 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(_replicas(ingress)) == 2


@pytest.mark.ray
def test_a_replica_stopped_mid_stream_ends_it_with_an_error_event_after_the_grace(ingress):
    """serve.delete with streams open: the replica lets them run for its grace time (build_app's shutdown_timeout_s,
    `serve --shutdown-timeout`'s 5 s), then each ends with its API's error event (OpenAI's then [DONE], Anthropic's
    `event: error`): the ingress's, as Serve ends the actor (Serve calls a replica's __del__ only once no request
    is left). Before, Serve's own 20 s, and the streams were cut with neither. The module's last test: it deletes
    the app."""
    import threading

    from llamaplug.integrations.ray import STOPPED
    from llamaplug.server.shutdown import DEFAULT_GRACE

    asks = {"/v1/completions": {"prompt": "Count from 1 to 1000: 1, 2, 3,", "max_tokens": 2000},
            "/v1/messages": {"messages": [{"role": "user", "content": "Write a very long story about a dragon and "
                                                                      "a knight, with many chapters."}],
                             "max_tokens": 2000, "model": "m"}}
    streams = []
    for path, body in asks.items():
        conn = http.client.HTTPConnection("127.0.0.1", ingress, timeout=90)
        conn.request("POST", path, json.dumps({**body, "stream": True, "temperature": 0}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        streams.append((conn, resp, []))
    for _, resp, events in streams:
        while len(events) < 4:  # each stream is going
            line = resp.readline()
            assert line, events
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
    start = time.monotonic()
    deleting = threading.Thread(target=serve.delete, args=(APP,), daemon=True)
    deleting.start()
    took = [0.0, 0.0]

    def read(i: int) -> None:
        conn, resp, events = streams[i]
        for line in resp:
            if line.startswith(b"data: "):
                events.append(None if line.strip() == b"data: [DONE]" else json.loads(line[6:]))
        took[i] = time.monotonic() - start
        conn.close()

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(streams))]
    for reader in readers:
        reader.start()
    for reader in [*readers, deleting]:
        reader.join(120)
    (_, _, openai_events), (_, _, anthropic_events) = streams
    print(f"\nreplicas deleted under 2 streams: they ended {took[0]:.1f} s, {took[1]:.1f} s later "
          f"({anthropic_events[-1]['type']})")
    assert openai_events[-1] is None and "error" in openai_events[-2], openai_events[-3:]
    assert openai_events[-2]["error"]["message"] == STOPPED  # the ingress's, in plain words
    assert DEFAULT_GRACE - 1 < took[0] < DEFAULT_GRACE + 8
    # the chat reply may end by itself within the grace time (as its API ends one), else it is cut as the other
    if took[1] > DEFAULT_GRACE - 1:
        assert anthropic_events[-1]["type"] == "error" and took[1] < DEFAULT_GRACE + 8, anthropic_events[-3:]
        assert anthropic_events[-1]["error"]["message"] == STOPPED
    else:
        assert anthropic_events[-1]["type"] == "message_stop"
