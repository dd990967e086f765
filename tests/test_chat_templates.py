"""Every template of the pin's models/templates/ talks as it does in llama-server (llama.cpp's chat layer).

For each template (the model makers' own files, 70 of them):
(a) the prompt of a conversation with a system message, a tool and a user turn equals what the pin's
    llama-server answers on /apply-template when started with --chat-template-file;
(b) a reply that calls the tool in the template's own format (the template's rendering of an assistant
    tool call, as llama.cpp's reference program cuts it: reference/chat_reference.cpp) comes back from
    `create_chat_completion(tools=...)` as the same tool_calls, content and reasoning_content as
    llama.cpp's parser gives, whole and streamed (deltas joined). The model is made to write exactly
    that reply by a Python sampler that keeps only the next token of it (the chat layer's grammar and
    stops stay in front of it, as in any request).
Templates where llama.cpp itself has no such reply (its rendering does not continue the prompt, or no
start of it parses into the call) are listed in NO_ROUND_TRIP by the test that checks that list.
"""

from __future__ import annotations

import concurrent.futures
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from llamaplug_testing import llama_server
from llamaplug_testing.chat_replies import ask, reference, same_message
from llamaplug_testing.settings import THREADS

import fetch
import llamaplug as lp
from llamaplug.high.chat import ChatSpec, plan_chat

TEMPLATES = sorted((fetch.materialise() / "models" / "templates").glob("*.jinja"))
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"]}}}
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the weather in Paris?"}]
# 9 letters and digits: Mistral's templates refuse other call ids.
ASSISTANT = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call0Abc9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}


@pytest.fixture(scope="module")
def model(smollm2_path):
    with lp.Llama.load(lp.LlamaParams(model_path=smollm2_path, n_ctx=8192, n_threads=THREADS)) as llama:
        yield llama


@pytest.fixture(scope="module")
def references(smollm2_path, native_tools) -> dict[str, dict[str, Any]]:
    """llama.cpp's reference program on every template (vocab-only loads: fast)."""
    import native_tools as tools

    program = tools.chat_reference()

    def one(path: Path) -> tuple[str, dict[str, Any]]:
        request = {"messages": MESSAGES, "tools": [TOOL]}
        return path.name, reference(program, smollm2_path, path.read_text(), request, ASSISTANT)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, TEMPLATES))


@pytest.fixture(scope="module")
def server_prompts(smollm2_path, native_tools) -> dict[str, Any]:
    """llama-server's /apply-template for every template (--chat-template-file), two servers at a time."""

    def one(path: Path) -> tuple[str, Any]:
        with llama_server(native_tools, smollm2_path, "--chat-template-file", str(path), "-c", "512") as port:
            body = json.dumps({"messages": MESSAGES, "tools": [TOOL]}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/apply-template", data=body)
            try:
                with urllib.request.urlopen(request, timeout=60) as resp:
                    return path.name, json.loads(resp.read())["prompt"]
            except urllib.error.HTTPError as err:
                return path.name, {"status": err.code, "error": err.read().decode()}

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, TEMPLATES))


def test_there_are_the_pins_templates():
    assert len(TEMPLATES) >= 70


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_prompt_with_tools_equals_llama_servers(path, model, server_prompts):
    theirs = server_prompts[path.name]
    try:
        ours = plan_chat(model, ChatSpec(MESSAGES, tools=[TOOL], chat_template=path.read_text())).params["prompt"]
    except lp.LlamaError as exc:
        # llama-server refuses the same template: a 4xx/5xx there, a LlamaError here
        assert isinstance(theirs, dict), f"llama-server rendered it, we raised {exc}"
        return
    assert ours == theirs


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_a_tool_call_in_the_templates_format_comes_back_as_llama_cpp_parses_it(path, model, references):
    ref = references[path.name]
    if ref.get("reply") is None:
        pytest.skip(f"llama.cpp has no tool-call reply for this template ({ref.get('error', 'see NO_ROUND_TRIP')})")
    chat = {"messages": MESSAGES, "tools": [TOOL], "chat_template": path.read_text()}
    same_message(ask(model, ref["reply"], stream=False, **chat), ref["message"])
    same_message(ask(model, ref["reply"], stream=True, **chat), ref["streamed"])
