"""`llamaplug serve` driven by the real `openai` client on loopback: results, streams, errors, keys, disconnects."""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
from llamaplug_testing import THREADS, llamaplug_server

import llamaplug as lp

SLOTS = 4
CTX = 4096  # the whole cache: 1024 positions a slot


@pytest.fixture(scope="module")
def server(smollm2_path):
    with llamaplug_server(smollm2_path, "--parallel", str(SLOTS), "-c", str(CTX), "--metrics") as (port, _):
        yield port


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def local(smollm2_path):
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=CTX // SLOTS, n_threads=THREADS)) as llama:
        yield llama


def metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {k: float(v) for k, v in (line.split() for line in text.splitlines() if line and line[0] != "#")}


def model_id(client) -> str:
    return client.models.list().data[0].id


def test_models_lists_the_served_file(client, smollm2_path):
    models = client.models.list().data
    assert [m.id for m in models] == [smollm2_path.stem]  # the file's name without .gguf


def test_chat_equals_the_library_and_streams_the_same_text(client, local):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three fruits."}]
    whole = client.chat.completions.create(model=model_id(client), messages=messages, max_tokens=24, temperature=0)
    want = local.create_chat_completion(messages, max_tokens=24)
    assert whole.choices[0].message.content == want.choices[0].message.content
    assert whole.choices[0].finish_reason == want.choices[0].finish_reason
    assert whole.usage.prompt_tokens == want.usage.prompt_tokens
    stream = client.chat.completions.create(model=model_id(client), messages=messages, max_tokens=24, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == want.choices[0].finish_reason


def test_completions_plain_streamed_and_several_prompts(client, local):
    prompts = ["The capital of France is", "def square(x):", "Snow is"]
    want = [local.create_completion(p, max_tokens=12).text for p in prompts]
    one = client.completions.create(model=model_id(client), prompt=prompts[0], max_tokens=12, temperature=0)
    assert one.choices[0].text == want[0] and one.choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_id(client), prompt=prompts[1], max_tokens=12, temperature=0, stream=True))
    assert streamed == want[1]
    many = client.completions.create(model=model_id(client), prompt=prompts, max_tokens=12, temperature=0)
    assert [c.text for c in sorted(many.choices, key=lambda c: c.index)] == want


def test_completion_logprobs_are_the_librarys(client, local):
    out = client.completions.create(model=model_id(client), prompt="The sky is", max_tokens=3, temperature=0,
                                    logprobs=2)
    want = local.create_completion("The sky is", max_tokens=3, logprobs=2)
    got = out.choices[0].logprobs
    assert got.tokens == [lp_.text for lp_ in want.logprobs]
    assert np.allclose(got.token_logprobs, [lp_.logprob for lp_ in want.logprobs], atol=1e-4)
    assert all(len(top) == 2 for top in got.top_logprobs)


def test_embeddings_float_and_base64_match_the_library(client, local):
    texts = ["a cat sat on the mat", "quantum chromodynamics"]
    want = local.embed(texts, pooling="mean")  # SmolLM2 has no pooling of its own: the server uses mean
    as_b64 = client.embeddings.create(model=model_id(client), input=texts)  # the client asks for base64
    as_float = client.embeddings.create(model=model_id(client), input=texts, encoding_format="float")
    for out in (as_b64, as_float):
        got = np.array([d.embedding for d in sorted(out.data, key=lambda d: d.index)])
        assert got.shape == want.shape
        assert np.allclose(got, want, atol=1e-5)
    assert as_float.usage.prompt_tokens == sum(len(local.tokenize(t)) for t in texts)


def test_requests_from_many_clients_share_batches(client, server, local):
    prompts = [f"Fact number {i}: the ocean" for i in range(8)]
    want = [local.create_completion(p, max_tokens=16).text for p in prompts]
    before = metrics(server)

    def ask(p: str) -> str:
        return client.completions.create(model=model_id(client), prompt=p, max_tokens=16, temperature=0).choices[0].text

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, prompts))
    after = metrics(server)
    assert got == want
    generated = after["llamaplug_generated_tokens_total"] - before["llamaplug_generated_tokens_total"]
    steps = after["llamaplug_decode_steps_total"] - before["llamaplug_decode_steps_total"]
    assert generated == 8 * 16 and steps < generated / 2  # several sequences in each decode


@pytest.mark.parametrize("call, status, param", [
    (lambda c: c.completions.create(model=model_id(c), prompt="x", max_tokens=-3), 400, "max_tokens"),
    (lambda c: c.completions.create(model=model_id(c), prompt="word " * 2000, max_tokens=1), 400, None),
    (lambda c: c.chat.completions.create(model=model_id(c), messages=[{"role": "wizard", "content": "x"}]),
     400, "messages[0].role"),
    (lambda c: c.chat.completions.create(model=model_id(c), messages=[], max_tokens=1), 400, "messages"),
    (lambda c: c.completions.create(model=model_id(c), prompt="x", n=3), 400, "n"),
    (lambda c: c.chat.completions.create(model=model_id(c), messages=[{"role": "user", "content": "x"}],
                                         response_format={"type": "json_schema", "json_schema": {}}),
     400, "response_format.json_schema"),
    (lambda c: c.completions.create(model=model_id(c), prompt=[1, 2, 10**9], max_tokens=1), 400, None),
    (lambda c: c.completions.create(model=model_id(c), prompt="x", max_tokens=1, extra_body={"top_k": 10**15}),
     400, "top_k"),  # found by schemathesis: it once stopped the engine
    (lambda c: c.completions.create(model=model_id(c), prompt=[2821, -9223372036854775809], max_tokens=1),
     400, None),  # found by schemathesis: beyond int64
], ids=["negative_max_tokens", "prompt_over_the_slot", "unknown_role", "no_messages", "n_3",
        "schema_missing", "token_outside_vocab", "top_k_beyond_int32", "token_beyond_int64"])
def test_bad_requests_get_openai_errors_and_the_server_stays_up(client, server, call, status, param):
    with pytest.raises(openai.APIStatusError) as err:
        call(client)
    assert err.value.status_code == status
    body = err.value.body
    assert isinstance(body, dict) and body["message"] and body["type"]
    if param is not None:
        assert body["param"] == param
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/health", timeout=10) as resp:
        assert resp.status == 200


def test_invalid_json_and_wrong_types_are_400(server):
    for payload in (b"{not json", json.dumps({"prompt": 5, "max_tokens": "many"}).encode()):
        conn = http.client.HTTPConnection("127.0.0.1", server, timeout=30)
        conn.request("POST", "/v1/completions", payload, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        assert resp.status == 400 and body["error"]["type"] == "invalid_request_error", body


def test_a_client_leaving_a_stream_frees_its_slot(server):
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=30)
    body = {"prompt": "Count from 1 to 1000: 1, 2, 3,", "max_tokens": 2000, "stream": True, "temperature": 0}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    for _ in range(3):
        assert resp.fp.readline()  # a few events arrive
    assert metrics(server)["llamaplug_slots_busy"] == 1
    conn.sock.close()
    conn.close()
    deadline = time.monotonic() + 10
    while metrics(server)["llamaplug_slots_busy"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metrics(server)["llamaplug_slots_busy"] == 0


def test_metrics_and_openapi(client, server):
    before = metrics(server)
    client.completions.create(model=model_id(client), prompt="Hi", max_tokens=2, temperature=0)
    m = metrics(server)
    assert m["llamaplug_slots"] == SLOTS and m["llamaplug_queue_length"] == 0
    # This test's own request, counted once whatever ran before it (nothing else runs meanwhile).
    assert m["llamaplug_requests_total"] - before["llamaplug_requests_total"] == 1
    assert m["llamaplug_finished_total"] - before["llamaplug_finished_total"] == 1
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/openapi.json", timeout=10) as resp:
        doc = json.loads(resp.read())
    assert {"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models"} <= set(doc["paths"])


def test_api_key_is_required_when_set(smollm2_path):
    with llamaplug_server(smollm2_path, "--parallel", "1", "-c", "512", "--api-key", "s3cret") as (port, _):
        base = f"http://127.0.0.1:{port}/v1"
        with pytest.raises(openai.AuthenticationError) as err:
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
        assert err.value.status_code == 401 and err.value.body["code"] == "invalid_api_key"
        good = openai.OpenAI(base_url=base, api_key="s3cret", max_retries=0)
        assert good.completions.create(model=good.models.list().data[0].id, prompt="Hi", max_tokens=2).choices
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
            assert resp.status == 200  # health needs no key


def test_binding_beyond_loopback_without_a_key_warns(smollm2_path):
    with llamaplug_server(smollm2_path, "--parallel", "1", "-c", "512", host="0.0.0.0") as (_, proc):
        pass
    assert "without --api-key" in proc.stderr.read()
