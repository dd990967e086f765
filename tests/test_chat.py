"""Chat: the GGUF's own template in a sandbox, llama.cpp's built-in templates, OpenAI-shaped results."""

from __future__ import annotations

import json

import jsonschema
import pytest

import llamaplug as lp
from llamaplug.high.chat_template import ChatTemplate, builtin_names

CONVERSATION = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris"},
    {"role": "user", "content": "And of Italy?"},
]


def test_the_gguf_template_renders_as_llama_cpps_own_formatting(llama):
    ours = ChatTemplate.for_model(llama.model).render(CONVERSATION, add_generation_prompt=True)
    # llama.cpp recognises SmolLM2's template as chatml and formats it without Jinja.
    theirs = ChatTemplate(name=llama.model.chat_template).render(CONVERSATION, add_generation_prompt=True)
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n")


def test_the_template_adds_its_default_system_prompt(llama):
    rendered = ChatTemplate.for_model(llama.model).render(CONVERSATION[1:2])
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_chat_completion_is_the_completion_of_the_rendered_prompt(llama):
    out = llama.create_chat_completion(CONVERSATION, max_tokens=24)
    prompt = ChatTemplate.for_model(llama.model).render(CONVERSATION)
    plain = llama.create_completion(llama.model.tokenize(prompt, False, special=True), 24)
    message = out.choices[0].message
    assert message.role == "assistant" and message.content == plain.text
    assert out.usage.prompt_tokens == len(plain.prompt_tokens)
    assert out.usage.completion_tokens == len(plain.tokens)
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert out.choices[0].finish_reason == ("stop" if plain.stop_reason == lp.StopReason.EOS else "length")


def test_until_the_end_of_the_turn_and_length(llama):
    out = llama.create_chat_completion(CONVERSATION)  # max_tokens=None: until <|im_end|>
    assert out.choices[0].finish_reason == "stop" and "<|im_end|>" not in out.choices[0].message.content
    assert llama.create_chat_completion(CONVERSATION, max_tokens=1).choices[0].finish_reason == "length"


def test_openai_shape_validates_with_the_openai_types(llama):
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    dumped = llama.create_chat_completion(CONVERSATION, max_tokens=8).model_dump()
    assert ChatCompletion.model_validate(dumped).choices[0].message.content == dumped["choices"][0]["message"][
        "content"]
    for chunk in llama.create_chat_completion(CONVERSATION, max_tokens=8, stream=True):
        ChatCompletionChunk.model_validate(chunk.model_dump())


def test_stream_deltas_join_to_the_content(llama):
    whole = llama.create_chat_completion(CONVERSATION, max_tokens=20).choices[0].message.content
    chunks = list(llama.create_chat_completion(CONVERSATION, max_tokens=20, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert len({c.id for c in chunks}) == 1


@pytest.mark.parametrize("template,fragment", [
    ("{{ raise_exception('system messages are not allowed') }}", "system messages are not allowed"),
    ("{% if %}", "does not compile"),
])
def test_template_errors(llama, template, fragment):
    with pytest.raises(lp.ChatTemplateError, match=fragment):
        llama.create_chat_completion(CONVERSATION, max_tokens=2, chat_template=template)


@pytest.mark.parametrize("template", ["{{ messages.__class__.__mro__ }}", "{{ cycler.__init__.__globals__ }}"])
def test_templates_reach_no_python_object(llama, template):
    """llama.cpp's Jinja engine has no Python objects to reach: such a template renders nothing."""
    assert ChatTemplate.for_model(llama.model, template).render(CONVERSATION) == ""
    with pytest.raises(lp.InvalidParameterError, match="no tokens"):
        llama.create_chat_completion(CONVERSATION, max_tokens=2, chat_template=template)


def test_template_helpers(llama):
    template = ("{{ bos_token }}#{{ eos_token }}#{{ strftime_now('%Y') }}#{{ tools | tojson }}#"
                "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    text = ChatTemplate.for_model(llama.model, template).render(CONVERSATION, tools=tools)
    bos, eos, year, tools_json, first = text.split("#", 4)
    # (llama.cpp's chat layer gives each tool a description, "" where it has none)
    assert eos == "<|im_end|>" and year.isdigit()
    assert [t["function"]["name"] for t in json.loads(tools_json)] == ["get_weather"]
    assert first == CONVERSATION[0]["content"]


def test_builtin_templates_by_name(llama):
    assert "llama3" in builtin_names() and "chatml" in builtin_names()
    text = ChatTemplate.for_model(llama.model, "llama3").render(CONVERSATION)
    assert "<|start_header_id|>user<|end_header_id|>" in text
    # The named template, not the model's own (chatml-like), is what the model reads: the reply and the prompt's
    # length are those of the llama3 rendering.
    out = llama.create_chat_completion(CONVERSATION, max_tokens=8, chat_template="llama3")
    plain = llama.create_completion(llama.model.tokenize(text, False, special=True), 8)
    assert out.usage.prompt_tokens == len(plain.prompt_tokens)
    assert out.choices[0].message.content == plain.text
    with pytest.raises(lp.InvalidParameterError, match="llama3"):
        llama.create_chat_completion(CONVERSATION, max_tokens=2, chat_template="no-such-template")


@pytest.mark.parametrize("messages,field,fragment", [
    ([], "messages", "non-empty"),
    ([{"role": "robot", "content": "hi"}], "messages[0].role", "robot"),
    ([{"role": "user"}], "messages[0].content", "text"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file://x.png"}}]}],
     "messages[0].content[0]", "llamaplug-mtmd"),
    ("hello", "messages", "list"),
])
def test_bad_messages(llama, messages, field, fragment):
    with pytest.raises(lp.InvalidParameterError) as err:
        llama.create_chat_completion(messages, max_tokens=2)
    assert err.value.field == field and fragment in str(err.value)


def test_text_parts(llama):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Capital of "}, {"type": "text", "text": "Spain?"}]}]
    plain = [{"role": "user", "content": "Capital of \nSpain?"}]  # parts are joined by newlines, as llama.cpp
    assert (llama.create_chat_completion(parts, max_tokens=6).choices[0].message.content
            == llama.create_chat_completion(plain, max_tokens=6).choices[0].message.content)


def test_chat_with_a_json_schema(llama):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    out = llama.create_chat_completion([{"role": "user", "content": "Which city is the capital of France?"}],
                                       max_tokens=60, response_format={"type": "json_schema",
                                                                       "json_schema": {"schema": schema}})
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)
