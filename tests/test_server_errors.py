"""The status of an error comes from its class, once; each API family words it in its own dialect (dialects.py).

The status mapping is pure Python (one case per class). The dialects are tested on the real app over a real
SmolLM2: a decode that fails (the one fault injected here, in place of a backend failure: llama_decode's
return code -3) must be a 500 in each family's body, and, once a stream's status line is out, each family's
own in-stream error event; the server goes on serving after it. An error met before any route (a wrong key,
an unknown path) takes the dialect of the routes its path belongs to.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from fastapi.testclient import TestClient

import llamaplug as lp
from llamaplug.errors import (
    BackendError,
    ClosedError,
    ContextOverflowError,
    DecodeError,
    InvalidParameterError,
    ModelNotFoundError,
    NoBackendError,
)
from llamaplug.server.app import create_app
from llamaplug.server.dialects import ANTHROPIC, NATIVE, OPENAI, RESPONSES
from llamaplug.server.errors import ApiError, as_api_error

KEY = "k"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize("error, status", [
    (InvalidParameterError("temperature must be >= 0", field="temperature"), 400),  # the client's: 400, its field
    (ContextOverflowError("the prompt has 900 tokens but a sequence holds 512"), 400),
    (ModelNotFoundError("no model file /x.gguf"), 404),
    (ClosedError("this Llama is closed"), 503),
    (DecodeError("llama_decode failed (-3)", -3), 500),
    (BackendError("the CUDA backend failed"), 500),
    (NoBackendError("no usable backend"), 500),  # a subclass takes its nearest listed class's status
])
def test_the_status_comes_from_the_error_class_in_every_dialect(error, status):
    api = as_api_error(error)
    assert api.status == status
    if status == 400:
        assert api.param == getattr(error, "field", None) and api.kind == "invalid_request_error"
    if status >= 500:
        assert api.kind == "server_error"
    for dialect in (OPENAI, NATIVE, ANTHROPIC, RESPONSES):
        resp = dialect.response(api)
        assert resp.status_code == status
        assert str(error) in resp.body.decode()


def test_each_dialect_words_a_status_as_its_api_does():
    error = ApiError(503, "the server is busy", "server_error", code="queue_full")
    assert OPENAI.body(error) == RESPONSES.body(error) == {
        "error": {"message": "the server is busy", "type": "server_error", "param": None, "code": "queue_full"}}
    assert NATIVE.body(error) == {"error": {"code": 503, "message": "the server is busy", "type": "unavailable_error"}}
    assert ANTHROPIC.body(error) == {"type": "error", "error": {"type": "api_error", "message": "the server is busy"}}
    assert ANTHROPIC.body(ApiError(404, "no such model"))["error"]["type"] == "not_found_error"
    assert NATIVE.body(ApiError(500, "failed"))["error"]["type"] == "server_error"


@pytest.fixture(scope="module")
def app_and_llama(smollm2_path):
    llama = lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=1024, n_seq_max=2, n_threads=2))
    with TestClient(create_app(llama, "smol", api_key=KEY)) as client:
        yield client, llama


@contextlib.contextmanager
def failing_decodes(llama, after: int):
    """The engine's decodes after the first `after` fail as a backend failure would (llama_decode's -3)."""
    ctx = llama.context
    real, calls = ctx.decode, 0

    def decode(batch):
        nonlocal calls
        calls += 1
        if calls > after:
            raise DecodeError("llama_decode failed: the compute graph failed (-3), injected by the test", -3)
        real(batch)

    ctx.decode = decode
    try:
        yield
    finally:
        del ctx.decode


CHAT = [{"role": "user", "content": "Count from one to twenty."}]
# path, body (stream added), and what each dialect's error event and 500 body look like
FAMILIES = {
    "openai": ("/v1/chat/completions", {"model": "smol", "messages": CHAT, "max_tokens": 32}),
    "native": ("/completion", {"prompt": "Count from one to twenty:", "n_predict": 32}),
    "anthropic": ("/v1/messages", {"model": "smol", "messages": CHAT, "max_tokens": 32}),
    "responses": ("/v1/responses", {"model": "smol", "input": "Count from one to twenty.", "max_output_tokens": 32}),
}


def _events(lines: list[str]) -> list[tuple[str | None, str]]:
    """(event name or None, data) of each server-sent event."""
    out, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            out.append((name, line.removeprefix("data: ")))
            name = None
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_a_failed_decode_is_a_500_in_each_dialect_and_the_server_goes_on(app_and_llama, family):
    client, llama = app_and_llama
    path, body = FAMILIES[family]
    with failing_decodes(llama, after=0):
        resp = client.post(path, json=body, headers=AUTH)
    assert resp.status_code == 500, resp.text
    got = resp.json()
    if family == "native":
        assert got["error"]["code"] == 500 and got["error"]["type"] == "server_error"
    elif family == "anthropic":
        assert got["type"] == "error" and got["error"]["type"] == "api_error"
    else:
        assert got["error"]["type"] == "server_error" and got["error"]["code"] == "decode_failed"
    assert "compute graph failed" in json.dumps(got)
    assert client.post(path, json=body, headers=AUTH).status_code == 200  # the next request is served


@pytest.mark.parametrize("family", FAMILIES)
def test_a_stream_cut_by_a_failed_decode_ends_with_its_dialects_error_event(app_and_llama, family):
    client, llama = app_and_llama
    path, body = FAMILIES[family]
    with failing_decodes(llama, after=1), client.stream("POST", path, json={**body, "stream": True},
                                                         headers=AUTH) as resp:
        assert resp.status_code == 200  # the status line went out before the failure
        events = _events(list(resp.iter_lines()))
    if family == "openai":
        name, data = events[-2]
        assert events[-1] == (None, "[DONE]") and name is None
        error = json.loads(data)["error"]
        assert error["type"] == "server_error" and error["code"] == "decode_failed"
    elif family == "native":  # llama-server's stream: no [DONE], the error as the last data event
        name, data = events[-1]
        assert name is None and json.loads(data)["error"]["code"] == 500
        assert json.loads(data)["error"]["type"] == "server_error"
    elif family == "anthropic":
        name, data = events[-1]
        assert name == "error" and json.loads(data) == {"type": "error", "error": {
            "type": "api_error", "message": json.loads(data)["error"]["message"]}}
        assert events[0][0] == "message_start"
    else:
        name, data = events[-1]
        error = json.loads(data)
        assert name == "error" and error["type"] == "error" and error["code"] == "decode_failed"
        assert error["sequence_number"] == len(events) - 1  # numbered after the stream's other events
    assert "compute graph failed" in events[-2 if family == "openai" else -1][1]
    assert client.post(path, json=body, headers=AUTH).status_code == 200


@pytest.mark.parametrize("path, family", [
    ("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"), ("/v1/responses", "responses"),
    ("/completion", "native"), ("/tokenize", "native"), ("/slots/0", "native"), ("/embeddings", "native"),
    ("/v1/embeddings", "openai"),
])
def test_a_wrong_key_is_worded_as_the_paths_routes_word_their_errors(app_and_llama, path, family):
    client, _ = app_and_llama
    resp = client.post(path, json={}, headers={"Authorization": "Bearer wrong"})
    assert resp.status_code == 401
    got = resp.json()
    assert {"openai": lambda: got["error"]["code"] == "invalid_api_key",
            "responses": lambda: got["error"]["code"] == "invalid_api_key",
            "native": lambda: got["error"]["code"] == 401 and got["error"]["type"] == "authentication_error",
            "anthropic": lambda: got["error"]["type"] == "authentication_error" and got["type"] == "error"}[family]()


def test_an_unknown_path_under_a_familys_routes_is_its_404(app_and_llama):
    client, _ = app_and_llama
    native = client.post("/slots/0/nothing", json={}, headers=AUTH)
    assert native.status_code == 404 and native.json()["error"]["code"] == 404
    openai_404 = client.get("/v1/nothing", headers=AUTH)
    assert openai_404.status_code == 404 and set(openai_404.json()["error"]) == {"message", "type", "param", "code"}
