"""Tool calls: parsed out of replies in each family's format, and forced by a grammar on the real model."""

from __future__ import annotations

import json

import jsonschema
import pytest
from test_json_schema import Matcher

import llamaplug as lp
from llamaplug.high.tool_calls import grammar_for, parse

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HERMES_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                   "{% if tools %}<|im_start|>system\nCall a tool as <tool_call>{\"name\": ..., \"arguments\": ...}"
                   "</tool_call>. Tools: {{ tools | tojson }}<|im_end|>\n{% endif %}<|im_start|>assistant\n")


@pytest.mark.parametrize("kind,text,content,calls", [
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "Sure.", [("get_weather", {"city": "Paris"})]),
    ("hermes", '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {"x": 1}}'
               "</tool_call>", None, [("a", {}), ("b", {"x": 1})]),
    ("hermes", "<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
    ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}]', None,
     [("get_time", {"zone": "UTC"})]),
    ("llama3", '<|python_tag|>{"name": "get_time", "parameters": {"zone": "CET"}}', None,
     [("get_time", {"zone": "CET"})]),
    ("json", '{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}', None, [("get_time", {"zone": "UTC"})]),
    ("json", "Just text.", "Just text.", []),
])
def test_parse_each_family(kind, text, content, calls):
    got_content, got_calls = parse(text, kind)
    assert got_content == content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in got_calls] == calls
    assert all(c.id.startswith("call_") and c.type == "function" for c in got_calls)


def test_the_forced_call_grammar_by_llama_cpps_engine(llama):
    m = Matcher(llama.model, grammar_for([WEATHER, TIME], "required", "hermes"))
    try:
        assert m.accepts('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
                         "</tool_call>")
        assert m.accepts('<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>')
        assert not m.accepts('<tool_call>{"name": "get_stock", "arguments": {}}</tool_call>')
        assert not m.accepts('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>')
        assert not m.accepts('{"name": "get_time", "arguments": {"zone": "UTC"}}')
    finally:
        m.close()


def test_required_tool_call_on_the_real_model(llama):
    out = llama.create_chat_completion(ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=80)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0].function
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.name]
    jsonschema.validate(json.loads(call.arguments), tool["function"]["parameters"])


def test_named_tool_call_in_a_hermes_template_and_streamed(llama):
    from openai.types.chat import ChatCompletionChunk

    choice = {"type": "function", "function": {"name": "get_time"}}
    out = llama.create_chat_completion(ASK, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=80,
                                       chat_template=HERMES_TEMPLATE)
    calls = out.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    chunks = list(llama.create_chat_completion(ASK, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=80,
                                               chat_template=HERMES_TEMPLATE, stream=True))
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk.model_dump())
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in deltas] == ["get_time"] and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert json.loads(deltas[0].function.arguments) == json.loads(calls[0].function.arguments)


def test_tools_reach_the_template(llama):
    from llamaplug.high.chat import render

    with_tools, _ = render(llama, ASK, HERMES_TEMPLATE, [WEATHER])
    without, _ = render(llama, ASK, HERMES_TEMPLATE, None)
    assert "get_weather" in llama.model.detokenize(with_tools, special=True)
    assert "get_weather" not in llama.model.detokenize(without, special=True)


@pytest.mark.parametrize("kwargs,field", [
    ({"tools": "get_weather"}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
])
def test_bad_tool_arguments(llama, kwargs, field):
    with pytest.raises(lp.InvalidParameterError) as err:
        llama.create_chat_completion(ASK, max_tokens=2, **kwargs)
    assert err.value.field == field
