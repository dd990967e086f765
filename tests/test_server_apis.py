"""`llamaplug serve` driven by the real `openai` client's Responses API and the real `anthropic` client's Messages API.

Both APIs are translations onto the chat path, so the reference for their text is the same
conversation through /v1/chat/completions, greedy. The server has an API key: the openai
client sends it as a bearer token, the anthropic client as `x-api-key`.

SmolLM2's chat template does not render tools, so the model never calls one on its own
(tool_choice auto gives text): the tool-call tests force the call (tool_choice naming the
tool), which puts the call grammar in front of the sampler.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request

import anthropic
import jsonschema
import openai
import pytest
from llamaplug_testing import llamaplug_server
from llamaplug_testing.chat_replies import TIME_TOOL, few_shot

KEY = "s3cret"
SLOTS = 2
GREEDY = {"temperature": 0}  # anthropic 2.x's messages.create has no temperature argument: it goes as extra_body
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
ASK_WEATHER = "What is the weather in Paris?"
# SmolLM2-135M calls a tool only after seeing it done: two earlier turns with calls, then the question.
FEW_SHOT = few_shot("hermes")
TIME_SCHEMA = TIME_TOOL["function"]["parameters"]
FRUITS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three fruits."}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    # chatml-tools: SmolLM2's own template has no place for tools (a request with tools would be refused)
    with llamaplug_server(smollm2_path, "--parallel", str(SLOTS), "-c", "2048", "--api-key", KEY,
                          "--chat-template", "chatml-tools", "--metrics") as (port, _):
        yield port


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{server}", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def model(oai):
    return oai.models.list().data[0].id


def chat(oai, model, messages, max_tokens, **kwargs):
    """The reference: the same conversation through /v1/chat/completions, greedy."""
    return oai.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                       **kwargs).choices[0]


def post(port: int, path: str, body: bytes | dict, headers: dict | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers={
        "Content-Type": "application/json", "x-api-key": KEY, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def busy_slots(port: int) -> float:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"x-api-key": KEY})
    with urllib.request.urlopen(req, timeout=10) as resp:
        found = dict(line.split()[-2:] for line in resp.read().decode().splitlines() if line and line[0] != "#")
    return float(found["llamaplug_slots_busy"])  # the sum over the served models


def healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
        return resp.status == 200


# --- OpenAI's Responses API ---------------------------------------------------------------------------------------


def test_responses_text_equals_chat_whole_streamed_and_accumulated(oai, model):
    want = chat(oai, model, FRUITS, 32)
    assert want.finish_reason == "stop"
    got = oai.responses.create(model=model, instructions=FRUITS[0]["content"], input=FRUITS[1]["content"],
                               max_output_tokens=32, temperature=0)
    assert got.object == "response" and got.status == "completed" and got.model == model
    assert got.output_text == want.message.content
    assert [item.type for item in got.output] == ["message"] and got.output[0].role == "assistant"
    assert got.usage.input_tokens > 0 and got.usage.total_tokens == got.usage.input_tokens + got.usage.output_tokens

    events = list(oai.responses.create(model=model, instructions=FRUITS[0]["content"], input=FRUITS[1]["content"],
                                       max_output_tokens=32, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want.message.content
    assert events[-1].response.output_text == want.message.content
    assert events[-1].response.usage.output_tokens == got.usage.output_tokens

    # The client's own accumulator (responses.stream) checks the events' order and identities.
    with oai.responses.stream(model=model, input=FRUITS, max_output_tokens=32, temperature=0) as stream:
        final = stream.get_final_response()
    assert final.output_text == want.message.content  # a system message in input is the same as instructions


def test_responses_cut_by_max_output_tokens_is_incomplete(oai, model):
    got = oai.responses.create(model=model, input="Count from one to fifty in words.", max_output_tokens=4,
                               temperature=0)
    want = chat(oai, model, [{"role": "user", "content": "Count from one to fifty in words."}], 4)
    assert got.status == "incomplete" and got.incomplete_details.reason == "max_output_tokens"
    assert got.output_text == want.message.content and got.usage.output_tokens == 4
    events = list(oai.responses.create(model=model, input="Count from one to fifty in words.", max_output_tokens=4,
                                       temperature=0, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"


def test_responses_function_call_cut_by_max_output_tokens_is_incomplete(oai, model):
    # OpenAI's: the response "incomplete" (reason max_output_tokens) and the item cut "incomplete" (was
    # "completed" for a call, whole and streamed). 20 tokens: cut in its arguments ('{"zone":'; 12 and fewer: before
    # the call's name, no item)
    tool = {"type": "function", "name": "get_time", "description": "The time in a zone", "parameters": TIME_SCHEMA}
    ask = {"model": model, "input": FEW_SHOT, "tools": [tool], "max_output_tokens": 20, "temperature": 0,
           "tool_choice": {"type": "function", "name": "get_time"}}
    got = oai.responses.create(**ask)
    assert got.status == "incomplete" and got.incomplete_details.reason == "max_output_tokens"
    assert [(item.type, item.status) for item in got.output] == [("function_call", "incomplete")], got.output
    events = list(oai.responses.create(**ask, stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.type, i.status, i.arguments) for i in done] == [("function_call", "incomplete", got.output[0].arguments)]
    assert events[-1].type == "response.incomplete"
    assert [(i.type, i.status) for i in events[-1].response.output] == [("function_call", "incomplete")]


def test_responses_function_call_then_its_output(oai, model):
    tool = {"type": "function", "name": "get_time", "description": "The time in a zone", "parameters": TIME_SCHEMA}
    got = oai.responses.create(model=model, input=FEW_SHOT, tools=[tool], max_output_tokens=60, temperature=0,
                               tool_choice={"type": "function", "name": "get_time"})
    assert got.status == "completed" and [item.type for item in got.output] == ["function_call"]
    call = got.output[0]
    assert call.name == "get_time" and call.call_id
    jsonschema.validate(json.loads(call.arguments), TIME_SCHEMA)

    events = list(oai.responses.create(model=model, input=FEW_SHOT, tools=[tool], max_output_tokens=60,
                                       temperature=0, tool_choice={"type": "function", "name": "get_time"},
                                       stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.type, i.name, i.arguments) for i in done] == [("function_call", "get_time", call.arguments)]
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == call.arguments

    # The second round: the call and its output as input items give what the chat API gives for them.
    result = '{"temperature_c": 18, "sky": "clear"}'
    follow = oai.responses.create(model=model, max_output_tokens=12, temperature=0, input=[
        *FEW_SHOT,
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": result}])
    want = chat(oai, model, [*FEW_SHOT,
                             {"role": "assistant", "content": None, "tool_calls": [{
                                 "id": call.call_id, "type": "function",
                                 "function": {"name": call.name, "arguments": call.arguments}}]},
                             {"role": "tool", "tool_call_id": call.call_id, "content": result}], 12)
    # (the same prompt: the same start; past a few tokens a reused prefix in another slot may tip a near-tie)
    assert follow.output_text.split()[:5] == want.message.content.split()[:5]


def test_responses_json_schema_text_format(oai, model):
    schema = {"type": "object", "properties": {"fruit": {"type": "string", "maxLength": 12}}, "required": ["fruit"],
              "additionalProperties": False}
    got = oai.responses.create(model=model, input="Name a fruit, as JSON.", max_output_tokens=40, temperature=0,
                               text={"format": {"type": "json_schema", "name": "fruit", "schema": schema}})
    jsonschema.validate(json.loads(got.output_text), schema)


@pytest.mark.parametrize("body, status, param", [
    ({"input": "x", "previous_response_id": "resp_123"}, 400, "previous_response_id"),
    ({"input": []}, 400, "input"),
    ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools.0.type"),
    ({"input": [{"type": "reasoning", "summary": []}]}, 400, "input.0"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, 400,
     "input.0.message.content.0.input_text.text"),
    ({"input": "x", "tool_choice": "required"}, 400, "tool_choice"),
    ({"input": "word " * 3000, "max_output_tokens": 1}, 400, None),
    (b"{not json", 400, "body"),
], ids=["previous_response_id", "no_input", "zero_tokens", "server_tool", "unknown_item",
        "part_without_text", "required_without_tools", "over_the_slot", "not_json"])
def test_responses_bad_requests_get_openai_errors(server, body, status, param):
    got_status, got = post(server, "/v1/responses", body)
    assert got_status == status, got
    assert set(got) == {"error"} and got["error"]["message"] and got["error"]["type"]
    if param is not None:
        assert got["error"]["param"] == param
    assert healthy(server)


def test_responses_errors_through_the_client(oai):
    # An unknown model is a 404 only with several models (one model answers to any name, as llama-server):
    # tests/test_serve_models.py checks it there.
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model=oai.models.list().data[0].id, input="x", previous_response_id="resp_1")


# --- Anthropic's Messages API -------------------------------------------------------------------------------------


def test_count_tokens_without_a_model_counts_on_the_default_one(server, claude, model):
    """llama-server counts without `model` (the pin's test_sleep.py sends none): the server's model, as with it."""
    messages = [{"role": "user", "content": "Hello world"}]
    status, body = post(server, "/v1/messages/count_tokens", {"messages": messages})
    assert status == 200
    assert body["input_tokens"] == claude.messages.count_tokens(model=model, messages=messages).input_tokens > 0


def test_messages_text_equals_chat_whole_and_streamed(claude, oai, model):
    want = chat(oai, model, FRUITS, 32)
    assert want.finish_reason == "stop"
    kwargs = dict(model=model, max_tokens=32, system=FRUITS[0]["content"], messages=FRUITS[1:], extra_body=GREEDY)
    got = claude.messages.create(**kwargs)
    assert got.type == "message" and got.role == "assistant" and got.model == model
    assert [b.type for b in got.content] == ["text"] and got.content[0].text == want.message.content
    assert got.stop_reason == "end_turn" and got.stop_sequence is None
    assert got.usage.output_tokens > 0 and got.usage.input_tokens + got.usage.cache_read_input_tokens > 0

    with claude.messages.stream(**kwargs) as stream:
        events = list(stream)  # the raw events (the client drops ping), each text delta followed by its "text"
        final = stream.get_final_message()
    kinds = [e.type for e in events if e.type != "text"]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert {e.delta.type for e in events if e.type == "content_block_delta"} == {"text_delta"}
    text = "".join(e.text for e in events if e.type == "text")
    assert text == want.message.content and final.content[0].text == text and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == got.usage.output_tokens

    # System blocks and text blocks are the same conversation as strings.
    blocks = claude.messages.create(model=model, max_tokens=32, extra_body=GREEDY,
                                    system=[{"type": "text", "text": FRUITS[0]["content"]}],
                                    messages=[{"role": "user",
                                               "content": [{"type": "text", "text": FRUITS[1]["content"]}]}])
    assert blocks.content[0].text == want.message.content


def test_messages_stop_sequence_and_max_tokens(claude, oai, model):
    whole = chat(oai, model, FRUITS[1:], 32).message.content
    stop = whole[len(whole) // 2:len(whole) // 2 + 3]  # a stop sequence the greedy reply is known to contain
    got = claude.messages.create(model=model, max_tokens=32, messages=FRUITS[1:], extra_body=GREEDY,
                                 stop_sequences=["never-in-this-reply", stop])
    assert got.stop_reason == "stop_sequence" and got.stop_sequence == stop
    assert got.content[0].text == whole[:whole.index(stop)]
    with claude.messages.stream(model=model, max_tokens=32, messages=FRUITS[1:], extra_body=GREEDY,
                                stop_sequences=[stop]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", stop,
                                                                               whole[:whole.index(stop)])
    short = claude.messages.create(model=model, max_tokens=3, messages=FRUITS[1:], extra_body=GREEDY)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def test_messages_tool_use_then_its_result(claude, oai, model):
    tools = [{"name": "get_time", "description": "The time in a zone", "input_schema": TIME_SCHEMA}]
    ask = FEW_SHOT
    got = claude.messages.create(model=model, max_tokens=60, messages=ask, tools=tools, extra_body=GREEDY,
                                 tool_choice={"type": "tool", "name": "get_time"})
    assert got.stop_reason == "tool_use" and [b.type for b in got.content] == ["tool_use"]
    use = got.content[0]
    assert use.name == "get_time" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, TIME_SCHEMA)

    with claude.messages.stream(model=model, max_tokens=60, messages=ask, tools=tools, extra_body=GREEDY,
                                tool_choice={"type": "tool", "name": "get_time"}) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds  # the client's own event for an input_json_delta
    assert final.stop_reason == "tool_use" and [(b.name, b.input) for b in final.content] == [(use.name, use.input)]

    # A call cut inside its arguments (greedy, 24 tokens end at '{\n    "city": "', which does not parse): as
    # Anthropic's tool_use cut by max_tokens, the call's block and stop_reason "max_tokens" (was a 500: json.loads).
    weather = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER_SCHEMA}]
    cut = claude.messages.create(model=model, max_tokens=24, messages=[{"role": "user", "content": ASK_WEATHER}],
                                 tools=weather, extra_body=GREEDY, tool_choice={"type": "any"})
    assert cut.stop_reason == "max_tokens" and [(b.type, b.name) for b in cut.content] == [("tool_use", "get_weather")]

    # The second round: tool_use and tool_result blocks give what the chat API gives for the same turns.
    result = '{"temperature_c": 18, "sky": "clear"}'
    follow = claude.messages.create(model=model, max_tokens=12, tools=tools, extra_body=GREEDY, messages=[
        *ask, {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                 "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]}])
    want = chat(oai, model, [*ask, {"role": "assistant", "content": None, "tool_calls": [{
        "id": use.id, "type": "function", "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": result}], 12,
        tools=[{"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                                 "parameters": TIME_SCHEMA}}])
    assert follow.content[0].text == want.message.content


@pytest.mark.parametrize("body, status, kind, names", [
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error", "max_tokens"),
    ({"max_tokens": "many", "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error",
     "max_tokens"),
    ({"max_tokens": 3}, 400, "invalid_request_error", "messages"),  # ([] is a reply, as llama-server's)
    ({"max_tokens": 3, "temperature": 1.5, "messages": [{"role": "user", "content": "x"}]}, 400,
     "invalid_request_error", "temperature"),
    ({"max_tokens": 3, "messages": [{"role": "user", "content": [{"type": "wizard"}]}]}, 400,
     "invalid_request_error", "wizard"),
    ({"max_tokens": 3, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, 400, "invalid_request_error", "tool_use"),
    ({"max_tokens": 3, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}, 400,
     "invalid_request_error", "input_schema"),
    ({"max_tokens": 3, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}}, 400,
     "invalid_request_error", "tool_choice"),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": "word " * 3000}]}, 400, "invalid_request_error",
     "context size"),
    (b"{not json", 400, "invalid_request_error", "JSON"),
], ids=["no_max_tokens", "max_tokens_not_int", "no_messages", "temperature_over_1",
        "unknown_block", "tool_use_from_user", "tool_without_schema", "tool_choice_without_tools", "over_the_slot",
        "not_json"])
def test_messages_bad_requests_get_anthropic_errors(server, model, body, status, kind, names):
    if isinstance(body, dict):
        body = {"model": model, **body}
    got_status, got = post(server, "/v1/messages", body)
    assert got_status == status, got
    assert got["type"] == "error" and got["error"]["type"] == kind and names in got["error"]["message"], got
    assert healthy(server)


def test_messages_errors_through_the_client(claude, model):
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=model, max_tokens=3, messages=[{"role": "user", "content": [{"type": "text"}]}])


# --- What every endpoint keeps ------------------------------------------------------------------------------------


def test_the_api_key_as_bearer_or_x_api_key(server, model):
    base = f"http://127.0.0.1:{server}"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(
            model=model, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).responses.create(model=model, input="Hi")
    status, _ = post(server, "/v1/responses", {"input": "Hi", "max_output_tokens": 2},
                     headers={"x-api-key": "", "Authorization": f"Bearer {KEY}"})
    assert status == 200
    status, _ = post(server, "/v1/messages", {"model": model, "max_tokens": 2, "messages": [
        {"role": "user", "content": "Hi"}]}, headers={"x-api-key": "wrong"})
    assert status == 401


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {"max_tokens": 2000, "stream": True, "messages": [{"role": "user", "content": "Count to 1000."}]}),
    ("/v1/responses", {"max_output_tokens": 2000, "stream": True, "input": "Count to 1000."}),
], ids=["messages", "responses"])
def test_a_client_leaving_a_stream_frees_its_slot(server, model, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=30)
    conn.request("POST", path, json.dumps({"model": model, "temperature": 0, **body}),
                 {"Content-Type": "application/json", "x-api-key": KEY})
    resp = conn.getresponse()
    assert resp.status == 200
    for _ in range(12):
        assert resp.fp.readline()  # a few events arrive
    assert busy_slots(server) == 1
    conn.sock.close()
    conn.close()
    deadline = time.monotonic() + 10
    while busy_slots(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert busy_slots(server) == 0


def test_openapi_lists_both(server):
    req = urllib.request.Request(f"http://127.0.0.1:{server}/openapi.json", headers={"x-api-key": KEY})
    with urllib.request.urlopen(req, timeout=10) as resp:
        doc = json.loads(resp.read())
    assert {"/v1/messages", "/v1/responses"} <= set(doc["paths"])
