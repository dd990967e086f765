"""Chat rendering equals llama.cpp's own: the pinned llama-server's POST /apply-template (its Jinja engine).

The server runs on loopback, started by the fixture and stopped after; every conversation
is rendered by it and by llamaplug, and the prompt strings must be equal.
"""

from __future__ import annotations

import pytest
from llamaplug_testing import llama_server, post_json

from llamaplug.high.chat import check_messages, render_prompt

SYS = {"role": "system", "content": "You are terse."}
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [SYS, {"role": "user", "content": "Hi"}],
    [SYS, {"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."},
     {"role": "user", "content": "And Italy?"}],
    [{"role": "user", "content": "Tell me a joke"}, {"role": "assistant", "content": "Why did"}],  # prefill
    [SYS, {"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}],  # prefill
    [{"role": "user", "content": "Unicode: héllo wörld 你好 🌍 — ∑"}],
    [{"role": "user", "content": "Line one\nLine two\n\n  indented"}],
    [{"role": "user", "content": "Braces {{ not a template }} {% raw %} <|im_start|>"}],
    [{"role": "user", "content": ""}],
    [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hello"}],
    [SYS, {"role": "user", "content": "Weather?"},
     {"role": "assistant", "content": "Let me check."}, {"role": "tool", "content": "{\"temp\": 21}"},
     {"role": "user", "content": "Thanks"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
     {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}],
    [{"role": "system", "content": "Multi\nline\nsystem"}, {"role": "user", "content": "ok"}],
    [{"role": "user", "content": "Quotes \" and ' and \\ backslash"}],
    [{"role": "user", "content": "x" * 2000}],
    [SYS, {"role": "user", "content": [{"type": "text", "text": "parts "}, {"type": "text", "text": "joined"}]}],
    [{"role": "user", "content": "Tabs\tand\r\nCRLF"}],
    [{"role": "user", "content": "Arabic مرحبا and Hindi नमस्ते"}],
    [SYS, {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
     {"role": "user", "content": "q2"}, {"role": "assistant", "content": "partial answer"}],  # prefill, multi-turn
    [{"role": "user", "content": "<think>not a reasoning block</think>"}],
    [{"role": "user", "content": "Emoji only 🙂🙃😉"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "empty system"}],
]


@pytest.fixture(scope="module")
def server(native_tools, smollm2_path):
    with llama_server(native_tools, smollm2_path, "-c", "2048", "--jinja") as port:
        yield port


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_rendering_equals_llama_server(llama, server, index):
    messages = CONVERSATIONS[index]
    theirs = post_json(server, "/apply-template", {"messages": messages})["prompt"]
    ours, _ = render_prompt(llama, check_messages(messages), None, None)
    assert ours == theirs


def test_greedy_chat_equals_the_completion_of_the_servers_prompt(llama, server):
    messages = CONVERSATIONS[2]
    prompt = post_json(server, "/apply-template", {"messages": messages})["prompt"]
    chat = llama.create_chat_completion(messages, max_tokens=24).choices[0].message.content
    plain = llama.create_completion(llama.model.tokenize(prompt, False, special=True), 24).text
    assert chat == plain


GEMMA_OVERRIDE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else "
                  "m.role }}\n{{ m.content | trim }}<end_of_turn>\n{% endfor %}"
                  "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def test_gemma_with_a_template_override_equals_llama_server(native_tools, tmp_path):
    """Gemma-3-270M (optional package) with a template given at load, ours vs the server's --chat-template-file."""
    from llamaplug.catalog import entries

    entry = next(e for e in entries() if e.name == "gemma-3-270m")
    path = entry.locate()
    if path is None:
        pytest.skip(f"Gemma-3-270M is not installed ({entry.install})")
    import llamaplug as lp

    template = tmp_path / "override.jinja"
    template.write_text(GEMMA_OVERRIDE)
    with lp.Llama.load(lp.LlamaParams(path, n_ctx=1024, n_threads=2)) as gemma, \
            llama_server(native_tools, path, "-c", "1024", "--jinja", "--chat-template-file", str(template)) as port:
        for messages in CONVERSATIONS[:12]:
            theirs = post_json(port, "/apply-template", {"messages": messages})["prompt"]
            ours, _ = render_prompt(gemma, check_messages(messages), GEMMA_OVERRIDE, None)
            assert ours == theirs, messages
