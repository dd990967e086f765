"""Reasoning as llama-server returns it: the thinking in reasoning_content, the answer in content.

For <think>-style templates (Qwen3, GLM-4.6, MiniMax-M2) and GPT-OSS's channels, the template's own rendering
of an assistant turn with reasoning is what the model writes (llamaplug_testing.chat_replies); llama.cpp's
chat layer (the reference program) reads it, and `create_chat_completion` must read it the same, whole
and streamed. `reasoning_format="none"` keeps the thinking inline in content, as llama-server does.
"""

from __future__ import annotations

import pytest
from llamaplug_testing.chat_replies import ask, reference, same_message
from llamaplug_testing.settings import THREADS

import fetch
import llamaplug as lp

TEMPLATES = fetch.materialise() / "models" / "templates"
THINKING = ["Qwen-Qwen3-0.6B.jinja", "GLM-4.6.jinja", "MiniMax-M2.jinja", "openai-gpt-oss-120b.jinja"]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
THOUGHT, ANSWER = "The user asks about the weather in Paris.", "It is sunny in Paris."
ASSISTANT = {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}


@pytest.fixture(scope="module")
def model(smollm2_path):
    with lp.Llama.load(lp.LlamaParams(model_path=smollm2_path, n_ctx=4096, n_threads=THREADS)) as llama:
        yield llama


@pytest.fixture(scope="module")
def program(native_tools):
    import native_tools as tools

    return tools.chat_reference()


@pytest.mark.parametrize("name", THINKING)
def test_the_thinking_is_reasoning_content_and_the_answer_content(name, model, program, smollm2_path):
    template = (TEMPLATES / name).read_text()
    ref = reference(program, smollm2_path, template, {"messages": MESSAGES}, ASSISTANT)
    assert ref["reply"], ref
    assert ref["message"]["reasoning_content"].strip() == THOUGHT  # llama.cpp itself splits them so
    assert ref["message"]["content"].strip() == ANSWER
    for stream in (False, True):
        ours = ask(model, ref["reply"], stream=stream, messages=MESSAGES, chat_template=template)
        same_message(ours, ref["streamed" if stream else "message"])
        assert ours["reasoning_content"].strip() == THOUGHT and ours["content"].strip() == ANSWER


@pytest.mark.parametrize("name", THINKING[:2])
def test_reasoning_format_none_keeps_the_thinking_inline(name, model, program, smollm2_path):
    template = (TEMPLATES / name).read_text()
    ref = reference(program, smollm2_path, template, {"messages": MESSAGES}, ASSISTANT, reasoning_format="none")
    assert ref["reply"], ref
    for stream in (False, True):
        ours = ask(model, ref["reply"], stream=stream, messages=MESSAGES, chat_template=template,
                   reasoning_format="none")
        same_message(ours, ref["streamed" if stream else "message"])
        assert THOUGHT in ours["content"] and ours["content"].rstrip().endswith(ANSWER)
        assert ours["reasoning_content"] == ""
