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
Where the template renders a finished turn otherwise than its prompt opens one (a thinking block the prompt
opens and a past turn drops), the reply is the turn after the prompt's generation prompt, the thinking block
closed first. Where that gives no reply, the pin's tests/test-chat.cpp's input for the template is the
reply (TEST_CHAT_CASES).
Templates where llama.cpp gives no such reply (its rendering does not continue the prompt it
made even so, its own grammar lets no start of it end, or no start of it parses back into the call) are listed in
NO_ROUND_TRIP with the reference's reason, and left out of the count: a test checks that list is exactly
those. Templates that cannot show tools at all (SmolLM3's, Gemma 2's, ...) are refused with tools for generation
here, where llama-server goes on without them: (a) checks that llama-server's prompt indeed lacks them, and that
/apply-template's rendering (which only shows the prompt) is llama-server's for them too.
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
NOT_CONTINUED = "the template's rendering of the turn does not continue its own prompt"
NO_ROUND_TRIP = {  # the reference program's own words (reference/chat_reference.cpp): why it has no reply
    'Apriel-1.6-15b-Thinker-fixed.jinja': 'no start of the rendered turn parses back into the call',
    'Cohere2MoE.jinja': 'no start of the rendered turn parses back into the call',
    'HuggingFaceTB-SmolLM3-3B.jinja': "llama.cpp's grammar lets no start of the rendered turn end",
    'Mistral-Small-3.2-24B-Instruct-2506.jinja': 'no start of the rendered turn parses back into the call',
    'deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja': 'no start of the rendered turn parses back into the call',
    'deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja': 'no start of the rendered turn parses back into the call',
    'google-gemma-2-2b-it.jinja': "llama.cpp's grammar lets no start of the rendered turn end",
    'ibm-granite-granite-3.3-2B-Instruct.jinja': "llama.cpp's grammar lets no start of the rendered turn end",
    'llama-cpp-rwkv-world.jinja': NOT_CONTINUED,
    'microsoft-Phi-3.5-mini-instruct.jinja': "llama.cpp's grammar lets no start of the rendered turn end",
    'tencent-Hy3.jinja': 'no start of the rendered turn parses back into the call',
    'upstage-Solar-Open-100B.jinja': 'no start of the rendered turn parses back into the call',
}

# Where the template's own rendering gives no reply, the pin's tests/test-chat.cpp may have one: its input for that
# template (verbatim) and the tool it calls. These are checked as the others are (the reply given to the reference
# program instead of derived), and so are not in NO_ROUND_TRIP.
TEST_CHAT_CASES = {
    'meetkai-functionary-medium-v3.1.jinja': ("special_function", '<function=special_function>{"arg1": 1}</function>'),
    'mistralai-Mistral-Nemo-Instruct-2407.jinja': (
        "special_function", '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]'),
    'CohereForAI-c4ai-command-r-plus-tool_use.jinja': (
        "special_function", 'Action:\n```json\n[{"tool_name": "special_function", "parameters": {"arg1": 1}}]\n```'),
    'CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja': (
        "special_function", "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n    "
        '{"tool_call_id": "0", "tool_name": "special_function", "parameters": {"arg1": 1}}\n]<|END_ACTION|>'),
    'NVIDIA-Nemotron-Nano-v2.jinja': (
        "special_function", "I'm\nthinking\n</think>\n<TOOLCALL>[{\"name\": \"special_function\", "
        '\"arguments\": {\"arg1\": 1}}]</TOOLCALL>'),
    'google-gemma-4-31B-it.jinja': ("get_time", '<|tool_call>call:get_time{city:<|"|>London<|"|>}<tool_call|>'),
    'LFM2-8B-A1B.jinja': (
        "special_function",
        "<think>I'm\nthinking</think><|tool_call_start|>[special_function(arg1=1)]<|tool_call_end|>"),
    'LFM2.5-Instruct.jinja': (
        "special_function",
        "<think>I'm\nthinking</think><|tool_call_start|>[special_function(arg1=1)]<|tool_call_end|>"),
}
TEST_CHAT_TOOLS = {  # test-chat.cpp's tools of those cases
    "special_function": {"type": "function", "function": {"name": "special_function", "description": "I'm special",
                         "parameters": {"type": "object", "properties": {"arg1": {
                             "type": "integer", "description": "The arg."}}, "required": ["arg1"]}}},
    "get_time": {"type": "function", "function": {"name": "get_time", "description": "Get the current time in a city",
                 "parameters": {"type": "object", "properties": {"city": {
                     "type": "string", "description": "City name"}}, "required": ["city"]}}},
}

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
def model(shallow_smollm2_path):
    # SmolLM2's vocabulary, tokenizer and template on one layer: the replies are forced token by token (`ask`),
    # so the other 29 layers would only slow down reading each template's long tools prompt.
    with lp.Llama.load(lp.LlamaParams(model_path=shallow_smollm2_path, n_ctx=8192, n_threads=THREADS)) as llama:
        yield llama


@pytest.fixture(scope="module")
def references(smollm2_path, native_tools) -> dict[str, dict[str, Any]]:
    """llama.cpp's reference program on every template (vocab-only loads: fast)."""
    import native_tools as tools

    program = tools.chat_reference()

    def one(path: Path) -> tuple[str, dict[str, Any]]:
        if path.name in TEST_CHAT_CASES:
            name, reply = TEST_CHAT_CASES[path.name]
            call = {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call0Abc9", "type": "function", "function": {"name": name, "arguments": "{}"}}]}
            return path.name, reference(program, smollm2_path, path.read_text(), {"messages": MESSAGES, "tools": [
                TEST_CHAT_TOOLS[name]]}, call, reply=reply)
        request = {"messages": MESSAGES, "tools": [TOOL]}
        return path.name, reference(program, smollm2_path, path.read_text(), request, ASSISTANT)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, TEMPLATES))


@pytest.fixture(scope="module")
def server_prompts(smollm2_path, native_tools) -> dict[str, Any]:
    """llama-server's /apply-template for every template (--chat-template-file), two servers at a time."""

    def one(path: Path) -> tuple[str, Any]:
        # --fit off: no second load of the model to plan memory (half the start of a server); no warmup decode.
        with llama_server(native_tools, smollm2_path, "--chat-template-file", str(path), "-c", "512", "--fit", "off",
                          "--no-warmup") as port:
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
    assert isinstance(theirs, str), f"llama-server refused the template: {theirs}"
    template = path.read_text()
    # what /apply-template answers: llama-server's prompt, also where the template has no place for tools
    shown = plan_chat(model, ChatSpec(MESSAGES, tools=[TOOL], chat_template=template), refuse_unseen_tools=False)
    assert shown.params["prompt"] == theirs
    try:
        ours = plan_chat(model, ChatSpec(MESSAGES, tools=[TOOL], chat_template=template)).params["prompt"]
    except lp.InvalidParameterError as exc:
        # A template with no place for tools: refused here, where llama-server goes on without them.
        assert exc.field == "tools" and "get_weather" not in theirs
        ours = plan_chat(model, ChatSpec(MESSAGES, tools=[TOOL], tool_choice="none",
                                         chat_template=template)).params["prompt"]
    assert ours == theirs


def test_the_templates_without_a_reference_reply_are_the_listed_ones(references):
    missing = {name: ref.get("why", ref.get("error")) for name, ref in references.items() if ref.get("reply") is None}
    assert missing == NO_ROUND_TRIP


@pytest.mark.parametrize("path", [p for p in TEMPLATES if p.name not in NO_ROUND_TRIP], ids=lambda p: p.name)
def test_a_tool_call_in_the_templates_format_comes_back_as_llama_cpp_parses_it(path, model, references):
    ref = references[path.name]
    assert ref.get("reply"), ref
    tool = TEST_CHAT_TOOLS[TEST_CHAT_CASES[path.name][0]] if path.name in TEST_CHAT_CASES else TOOL
    chat = {"messages": MESSAGES, "tools": [tool], "chat_template": path.read_text()}
    same_message(ask(model, ref["reply"], stream=False, **chat), ref["message"])
    same_message(ask(model, ref["reply"], stream=True, **chat), ref["streamed"])
