"""Choosing the structured engine (issue 42 part 3): the call's structured_engine, LlamaParams.structured_engine,
"auto" with and without the plugin (hidden from the plugin manager), tools keeping the chat layer's GBNF.

The two engines differ where llama.cpp's GBNF converter is loose: it accepts any string for a pattern it cannot
express (\\d) and does not enforce uniqueItems, where llguidance enforces the one and refuses the other by name.
"""

from __future__ import annotations

import json
import re
import urllib.request

import jsonschema
import pytest

import llamaplug as lp
from llamaplug import plugins
from llamaplug.high.structured import engine_for

CODE = {"type": "object", "properties": {"code": {"type": "string", "pattern": r"^[A-Z]{2}-\d{3}$"}},
        "required": ["code"], "additionalProperties": False}
UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
ASK = [{"role": "user", "content": "Give a product code (two letters, a dash, three digits) as JSON."}]


def rf(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


@pytest.fixture
def without_llguidance():
    """The plugin unregistered from the plugin manager for one test, as if it were not installed."""
    plugins.load_plugins()
    hidden = plugins.pm.unregister(name="llguidance")
    assert hidden is not None and "llguidance" not in plugins.sampler_factories()
    try:
        yield
    finally:
        plugins.pm.register(hidden, name="llguidance")


def test_the_call_field_chooses_llguidance(llama) -> None:
    out = llama.create_chat_completion(ASK, response_format=rf(CODE), structured_engine="llguidance", max_tokens=40)
    content = out.choices[0].message.content
    print(f"llguidance chat: {content!r}")
    jsonschema.validate(json.loads(content), CODE)  # the pattern held
    out = llama.create_completion("Code: ", response_format=rf(CODE), structured_engine="llguidance", max_tokens=40)
    assert re.fullmatch(r"[A-Z]{2}-\d{3}", json.loads(out.text)["code"]), out.text
    with pytest.raises(lp.InvalidParameterError, match=r"uniqueItems") as err:
        llama.create_chat_completion(ASK, response_format=rf(UNIQUE), structured_engine="llguidance", max_tokens=4)
    assert err.value.field == "json_schema"
    with pytest.raises(lp.InvalidParameterError, match="structured_engine must be one of") as err:
        llama.create_completion("x", response_format=rf(CODE), structured_engine="xgrammar", max_tokens=4)
    assert err.value.field == "structured_engine"


def test_gbnf_takes_what_it_takes_as_llama_server(llama) -> None:
    # The default engine (LlamaParams' "gbnf") is llama.cpp's converter: uniqueItems is not enforced, not refused.
    out = llama.create_completion("Numbers: ", response_format=rf(UNIQUE), max_tokens=6)
    assert out.text.startswith("[")
    out = llama.create_completion("Numbers: ", response_format=rf(UNIQUE), structured_engine="gbnf", max_tokens=6)
    assert out.text.startswith("[")


def test_llama_params_default(smollm2_path) -> None:
    with lp.Llama.load(lp.LlamaParams(model_path=smollm2_path, n_ctx=512, structured_engine="llguidance")) as llama:
        with pytest.raises(lp.InvalidParameterError, match="uniqueItems"):
            llama.create_completion("x", response_format=rf(UNIQUE), max_tokens=4)
        # the call's field wins over the Llama's
        assert llama.create_completion("x", response_format=rf(UNIQUE), structured_engine="gbnf",
                                       max_tokens=4).text.startswith("[")


def test_auto_takes_llguidance_when_installed(llama) -> None:
    assert engine_for("auto", None) == "llguidance"
    with pytest.raises(lp.InvalidParameterError, match="uniqueItems"):
        llama.create_completion("x", response_format=rf(UNIQUE), structured_engine="auto", max_tokens=4)


def test_auto_without_the_plugin_is_gbnf(llama, without_llguidance) -> None:
    assert engine_for("auto", None) == "gbnf"
    out = llama.create_completion("Numbers: ", response_format=rf(UNIQUE), structured_engine="auto", max_tokens=6)
    assert out.text.startswith("[")
    with pytest.raises(lp.InvalidParameterError, match="pip install llamaplug-llguidance") as err:
        llama.create_completion("x", response_format=rf(CODE), structured_engine="llguidance", max_tokens=4)
    assert err.value.field == "structured_engine"


def test_tools_keep_the_chat_layers_grammar(llama) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]
    with pytest.raises(lp.InvalidParameterError, match="tool-call grammar") as err:
        llama.create_chat_completion(ASK, tools=tools, response_format=rf(CODE), structured_engine="llguidance",
                                     max_tokens=4)
    assert err.value.field == "structured_engine"


@pytest.fixture(scope="module")
def llguidance_server(smollm2_path):
    from llamaplug_testing.servers import llamaplug_server

    with llamaplug_server(smollm2_path, "--structured-engine", "llguidance", "-np", "1", "-c", "1024") as (port, _):
        yield port


def test_the_server_flag_and_the_request_field(llguidance_server) -> None:
    from llamaplug_testing.servers import post_status

    port = llguidance_server
    chat = {"messages": ASK, "max_tokens": 40, "temperature": 0, "response_format": rf(CODE)}
    status, body = post_status(port, "/v1/chat/completions", chat)
    assert status == 200, body
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), CODE)  # the flag's llguidance
    # llguidance refuses uniqueItems: a 400 naming the keyword, and the server stays up
    status, body = post_status(port, "/v1/chat/completions", {**chat, "response_format": rf(UNIQUE)})
    assert status == 400 and "uniqueItems" in body["error"]["message"], body
    # the request's field wins over the flag: GBNF takes uniqueItems (loosely, as llama-server). Greedy, because the
    # chat layer's grammar also admits a ```json fence, and a sampled reply cut inside the fence has no content yet
    status, body = post_status(port, "/v1/chat/completions", {**chat, "response_format": rf(UNIQUE), "max_tokens": 16,
                                                              "structured_engine": "gbnf"})
    assert status == 200 and body["choices"][0]["message"]["content"].startswith("["), body
    status, body = post_status(port, "/v1/chat/completions", {**chat, "structured_engine": "xgrammar"})
    assert status == 400 and "structured_engine" in json.dumps(body), body
    # llama-server's json_schema and grammar fields, on /completion and the chat
    # (greedy: llguidance's JSON lets whitespace run on, and a sampled reply may spend its 40 tokens on it)
    status, body = post_status(port, "/completion", {"prompt": "Code: ", "n_predict": 40, "json_schema": CODE,
                                                     "temperature": 0})
    assert status == 200, body
    jsonschema.validate(json.loads(body["content"]), CODE)
    status, body = post_status(port, "/completion", {"prompt": "Numbers: ", "n_predict": 8, "json_schema": UNIQUE})
    assert status == 400 and "uniqueItems" in body["error"]["message"], body
    status, body = post_status(port, "/v1/chat/completions", {"messages": ASK, "max_tokens": 8,
                                                              "grammar": 'root ::= "yes" | "no"'})
    assert status == 200 and body["choices"][0]["message"]["content"] in ("yes", "no"), body
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
        assert resp.status == 200


def _anthropic(body: dict) -> str:
    return "".join(b.get("text", "") for b in body["content"])


def _responses(body: dict) -> str:
    return "".join(p["text"] for item in body["output"] if item["type"] == "message" for p in item["content"])


def test_the_request_field_on_the_other_api_families(llguidance_server, smollm2_path) -> None:
    """Anthropic's output_config.format, Responses' text.format, Ollama's format (chat, generate, raw generate):
    each constrained by the server's flag (llguidance: the pattern holds, uniqueItems is a 400 naming it in the
    family's error shape), the request's structured_engine winning over it, a bad one a 400 naming the field."""
    from llamaplug_testing.servers import post_status

    port, name = llguidance_server, smollm2_path.stem
    families = {  # path -> (the request for a schema, the reply's text, the error's message)
        "/v1/messages": (lambda s, n=40: {"model": name, "messages": ASK, "max_tokens": n, "temperature": 0,
                                          "output_config": {"format": {"type": "json_schema", "schema": s}}},
                         _anthropic, lambda b: b["type"] == "error" and b["error"]["message"]),
        "/v1/responses": (lambda s, n=40: {"model": name, "input": ASK[0]["content"], "max_output_tokens": n,
                                           "temperature": 0, "store": False,
                                           "text": {"format": {"type": "json_schema", "name": "answer", "schema": s}}},
                          _responses, lambda b: b["error"]["message"]),
        "/api/chat": (lambda s, n=40: {"model": name, "messages": ASK, "stream": False, "format": s,
                                       "options": {"temperature": 0, "num_predict": n}},
                      lambda b: b["message"]["content"], lambda b: b["error"]),
        "/api/generate": (lambda s, n=40: {"model": name, "prompt": ASK[0]["content"], "stream": False,
                                           "format": s, "options": {"temperature": 0, "num_predict": n}},
                          lambda b: b["response"], lambda b: b["error"]),
    }
    for path, (ask, text, error) in families.items():
        status, body = post_status(port, path, ask(CODE))
        assert status == 200, (path, body)
        print(f"{path} llguidance: {text(body)!r}")
        jsonschema.validate(json.loads(text(body)), CODE)  # the flag's llguidance: the pattern held
        status, body = post_status(port, path, ask(UNIQUE))
        assert status == 400 and "uniqueItems" in error(body), (path, body)
        status, body = post_status(port, path, {**ask(UNIQUE, 12), "structured_engine": "gbnf"})
        # GBNF takes it loosely (/api/generate gives the reply as written: the chat layer's ```json fence too)
        assert status == 200 and "[" in text(body), (path, body)
        status, body = post_status(port, path, {**ask(CODE), "structured_engine": "xgrammar"})
        assert status == 400 and "structured_engine" in error(body), (path, body)
    # /api/generate raw: the prompt as it is, constrained as /completion's json_schema
    raw = {"model": name, "prompt": "Code: ", "raw": True, "stream": False, "format": CODE,
           "options": {"temperature": 0, "num_predict": 40}}
    status, body = post_status(port, "/api/generate", raw)
    assert status == 200, body
    jsonschema.validate(json.loads(body["response"]), CODE)
    status, body = post_status(port, "/api/generate", {**raw, "format": UNIQUE})
    assert status == 400 and "uniqueItems" in body["error"], body
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
        assert resp.status == 200
