"""`serve --no-jinja` (llama-server's flag, passed by its own test suite to every server that does not ask for
Jinja): the prompt comes from llama.cpp's built-in template of the model's family, and tools are refused with
llama-server's words. The reference is the pin's llama-server run with the same flag."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from llamaplug_testing import llama_server, llamaplug_server

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def post(port: int, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def servers(smollm2_path, native_tools):
    with llamaplug_server(smollm2_path, "--no-jinja", "-c", "512") as (ours, _), \
            llama_server(native_tools, smollm2_path, "--no-jinja", "-c", "512") as theirs:
        yield ours, theirs


def test_the_prompt_is_llama_servers_built_in_rendering(servers):
    ours, theirs = servers
    want = post(theirs, "/apply-template", {"messages": MESSAGES})
    got = post(ours, "/apply-template", {"messages": MESSAGES})
    assert want[0] == 200 and got == want
    jinja_prompt = want[1]["prompt"]
    reply = post(ours, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "temperature": 0})
    assert reply[0] == 200 and reply[1]["usage"]["prompt_tokens"] > 0, (jinja_prompt, reply)


@pytest.mark.parametrize("extra", [{"tools": TOOLS}, {"tool_choice": "none"}], ids=["tools", "tool_choice"])
def test_tools_are_refused_as_llama_server_refuses_them(servers, extra):
    ours, theirs = servers
    body = {"messages": MESSAGES, "max_tokens": 4, **extra}
    status, answer = post(theirs, "/v1/chat/completions", body)
    mine, error = post(ours, "/v1/chat/completions", body)
    # llama-server's words; its status is a 500 (a runtime_error), where a request's own field is a 400 here
    print(f"llama-server: {status} {answer['error']['message']!r}")
    assert (mine, error["error"]["message"]) == (400, answer["error"]["message"])
    assert error["error"].get("param") == next(iter(extra))
