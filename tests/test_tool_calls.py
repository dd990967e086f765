"""Tool calls on the real model through llama.cpp's chat layer: forced by its grammar, named, streamed.

How each template's calls are written and read is llama.cpp's (common/chat.h): tests/test_chat_templates.py
checks every template of the pin against its reference; these are the request-level behaviours."""

from __future__ import annotations

import json

import jsonschema
import pytest
from llamaplug_testing.chat_replies import TIME_TOOL, few_shot

import fetch
import llamaplug as lp
from llamaplug.high.chat import ChatSpec, plan_chat

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# A Hermes-style template (<tool_call>...</tool_call>), the model maker's own file in the pin.
HERMES_TEMPLATE = (fetch.materialise() / "models" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()


def test_required_tool_call_on_the_real_model(llama):
    out = llama.create_chat_completion(few_shot("hermes"), tools=[WEATHER, TIME_TOOL], tool_choice="required",
                                       max_tokens=80, chat_template=HERMES_TEMPLATE)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0].function
    tool = {"get_weather": WEATHER, "get_time": TIME_TOOL}[call.name]
    jsonschema.validate(json.loads(call.arguments), tool["function"]["parameters"])


def test_named_tool_call_in_a_hermes_template_and_streamed(llama):
    from openai.types.chat import ChatCompletionChunk

    choice = {"type": "function", "function": {"name": "get_time"}}
    ask = few_shot("hermes")
    out = llama.create_chat_completion(ask, tools=[WEATHER, TIME_TOOL], tool_choice=choice, max_tokens=80,
                                       chat_template=HERMES_TEMPLATE)
    calls = out.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    chunks = list(llama.create_chat_completion(ask, tools=[WEATHER, TIME_TOOL], tool_choice=choice, max_tokens=80,
                                               chat_template=HERMES_TEMPLATE, stream=True))
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk.model_dump())
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    # as llama-server streams a call: the id and name first, then the arguments piece by piece
    assert deltas[0].id and deltas[0].function.name == "get_time" and {d.index for d in deltas} == {0}
    assert len(deltas) > 2 and all(d.id is None and d.function.name is None for d in deltas[1:])
    joined = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(joined) == json.loads(calls[0].function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tools_reach_the_template(llama):
    with_tools = plan_chat(llama, ChatSpec(ASK, tools=[WEATHER], chat_template=HERMES_TEMPLATE)).params["prompt"]
    without = plan_chat(llama, ChatSpec(ASK, chat_template=HERMES_TEMPLATE)).params["prompt"]
    assert "get_weather" in with_tools and "get_weather" not in without


def test_tools_reach_a_template_that_has_no_place_for_them(llama):
    """SmolLM2's template never renders tools (llama-server would go on without them): a clear error, naming
    the way out; with chat_template="chatml-tools" the model sees them."""
    with pytest.raises(lp.InvalidParameterError, match="chatml-tools") as err:
        llama.create_chat_completion(ASK, tools=[WEATHER], max_tokens=4)
    assert err.value.field == "tools"
    prompt = plan_chat(llama, ChatSpec(ASK, tools=[WEATHER], chat_template="chatml-tools")).params["prompt"]
    assert "get_weather" in prompt
    assert llama.create_chat_completion(ASK, tools=[WEATHER], tool_choice="none", max_tokens=2).choices


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
