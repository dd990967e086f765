"""MCP tools on `llamaplug serve --mcp-config FILE`: a tiny stdio MCP server (tests/fixtures/mcp_lookup_server.py,
the official `mcp` SDK) whose tools GET /tools lists and a chat request that asks for them gets run by the server.

SmolLM2 is made to call the tool with tool_choice; the MCP server's answer comes back in the reply's mcp_calls
(and its calls file shows it ran), the loop stops at --mcp-max-steps, and a request that did not ask never
starts the MCP server (its calls file stays as it was).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fixtures import mcp_lookup_server
from fixtures.mcp_lookup_server import secret
from llamaplug_testing import llamaplug_server, post_status

from llamaplug.errors import InvalidParameterError
from llamaplug.high.mcp_tools import parse_config

MAX_STEPS = 1
FORCED = {"type": "function", "function": {"name": "lookup_multiply"}}  # integers: short arguments
# one call a round: a second call cut short by max_tokens would be half a call
ONE_CALL = {"tool_choice": FORCED, "parallel_tool_calls": False, "max_tokens": 48, "temperature": 0}
ASKED = [{"type": "mcp", "server_label": "lookup", "allowed_tools": ["multiply"]}]
QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]


@pytest.fixture(scope="module")
def calls(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "calls.txt"


@pytest.fixture(scope="module")
def config(calls) -> Path:
    path = calls.parent / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"lookup": {
        "command": sys.executable, "args": [mcp_lookup_server.__file__], "env": {"MCP_CALLS": str(calls)}}}}))
    return path


@pytest.fixture(scope="module")
def server(smollm2_path, config):
    with llamaplug_server(smollm2_path, "-c", "2048", "--parallel", "1", "--chat-template", "chatml-tools",
                          "--no-responses-store", "--mcp-config", str(config), "--mcp-max-steps", str(MAX_STEPS)
                          ) as (port, _):
        yield port


def get(port: int, path: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def called(calls: Path) -> list[str]:
    return calls.read_text().split() if calls.exists() else []


def test_tools_are_listed(server, config):
    from mcp import Client, StdioServerParameters

    async def theirs():  # the MCP server's own listing, through the SDK's client
        async with Client(StdioServerParameters(command=sys.executable, args=[mcp_lookup_server.__file__])) as c:
            return {t.name: t for t in (await c.list_tools()).tools}

    reference = asyncio.run(theirs())
    status, tools = get(server, "/tools")
    assert status == 200
    assert [t["tool"] for t in tools] == [f"lookup_{name}" for name in reference]  # llama-server's names
    for tool in tools:
        own = reference[tool["tool"].removeprefix("lookup_")]
        assert tool["type"] == "mcp"
        assert tool["definition"] == {"type": "function", "function": {
            "name": tool["tool"], "description": own.description, "parameters": own.input_schema}}


def test_the_server_runs_the_call_and_the_loop_is_bounded(server, calls):
    before = called(calls)
    status, reply = post_status(server, "/v1/chat/completions", {
        "messages": QUESTION, "tools": ASKED, **ONE_CALL}, timeout=600)
    assert status == 200, reply
    runs = reply["mcp_calls"]
    # tool_choice holds in every round: it is called each round until the bound, then the model answers
    assert len(runs) == MAX_STEPS and called(calls) == before + ["multiply"] * MAX_STEPS
    for run in runs:
        assert run["name"] == "lookup_multiply" and run["server"] == "lookup" and not run["is_error"]
        given = json.loads(run["arguments"])
        assert run["output"] == str(given["a"] * given["b"])  # the MCP server's answer
    assert reply["choices"][0]["finish_reason"] != "tool_calls" and not reply["choices"][0]["message"].get("tool_calls")
    # the results were read: every round's prompt is in the usage, each longer than the last by a call and result
    assert reply["usage"]["prompt_tokens"] > (MAX_STEPS + 1) * 150


def test_streamed(server, calls):
    before = called(calls)
    body = {"messages": QUESTION, "tools": ASKED, **ONE_CALL,
            "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{server}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        lines = [line.decode()[6:].strip() for line in resp if line.startswith(b"data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    made = [c["choices"][0]["delta"]["mcp_call"] for c in chunks if c["choices"] and
            "mcp_call" in c["choices"][0]["delta"]]
    assert len(made) == MAX_STEPS and all(m["output"] == str(json.loads(m["arguments"])["a"] *
                                                              json.loads(m["arguments"])["b"]) for m in made)
    assert called(calls) == before + ["multiply"] * MAX_STEPS
    ends = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(ends) == 1 and ends[0] != "tool_calls" and chunks[-1]["usage"]["prompt_tokens"] > 0


def test_a_request_that_does_not_ask_runs_no_tool(server, calls):
    before = called(calls)
    # the same name as the MCP tool, as the request's own function: the client's to run, not the server's
    own = [{"type": "function", "function": {"name": "lookup_multiply", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}}}]
    status, reply = post_status(server, "/v1/chat/completions", {
        "messages": QUESTION, "tools": own, **ONE_CALL}, timeout=600)
    assert status == 200 and "mcp_calls" not in reply
    assert reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "lookup_multiply"
    assert called(calls) == before  # the MCP server was never started


def test_bad_requests(server):
    status, reply = post_status(server, "/v1/chat/completions", {
        "messages": QUESTION, "tools": [{"type": "mcp", "server_label": "nope"}], "max_tokens": 4})
    assert status == 400 and reply["error"]["param"] == "tools[0].server_label"
    status, reply = post_status(server, "/v1/chat/completions", {
        "messages": QUESTION, "tools": [{**ASKED[0], "allowed_tools": ["none_such"]}], "max_tokens": 4})
    assert status == 400 and reply["error"]["param"] == "tools"


def test_off_unless_configured(smollm2_path):
    with llamaplug_server(smollm2_path, "-c", "512", "--no-responses-store") as (port, _):
        status, reply = get(port, "/tools")
        # llama-server's answer (its error type by status, as every native route's: permission_error)
        assert status == 403 and reply["error"]["message"].startswith("this feature is disabled")
        status, reply = post_status(port, "/v1/chat/completions", {"messages": QUESTION, "tools": ASKED,
                                                                    "max_tokens": 4})
        assert status == 400 and reply["error"]["param"] == "tools" and "--mcp-config" in reply["error"]["message"]


@pytest.mark.parametrize(("config", "field"), [
    ({}, "mcpServers"),
    ({"mcpServers": {"a b": {"command": "x"}}}, "mcpServers.a b"),
    ({"mcpServers": {"s": {"args": []}}}, "mcpServers.s.command"),
    ({"mcpServers": {"s": {"command": "x", "args": "y"}}}, "mcpServers.s.args"),
    ({"mcpServers": {"s": {"command": "x", "timeout_ms": 0}}}, "mcpServers.s.timeout_ms"),
])
def test_a_bad_config_names_its_key(config, field):
    with pytest.raises(InvalidParameterError) as bad:
        parse_config(config, "mcp.json")
    assert bad.value.field == field and "mcp.json" in str(bad.value)


def test_the_loop_with_a_scripted_model():
    """The loop's own logic, the model replaced by a script that always calls (pure Python: the real model's
    runs are above): tool_choice held for --mcp-max-steps rounds, then "none"; the calls and results in the
    messages of each next round, the usage of every round summed."""
    import types

    from llamaplug.high.chat_output import ChatMessage, Choice, FunctionCall, ToolCall, Usage
    from llamaplug.high.mcp_tools import McpTools
    from llamaplug.server.mcp.loop import mcp_chat
    from llamaplug.server.openai.schemas import ChatReply, ChatRequest

    tools = asyncio.run(McpTools(parse_config({"mcpServers": {"lookup": {
        "command": sys.executable, "args": [mcp_lookup_server.__file__]}}})).start())
    asked = []

    async def model(body, _request, _served):
        asked.append(body)
        call = ToolCall(id=f"call{len(asked)}", function=FunctionCall(name="lookup_secret_word",
                                                                      arguments='{"topic": "cats"}'))
        done = body.tool_choice == "none"
        message = ChatMessage(role="assistant", content="done" if done else None, tool_calls=None if done else [call])
        return ChatReply(id="r", created=0, model="m", usage=Usage(prompt_tokens=100, completion_tokens=10,
                                                                   total_tokens=110),
                         choices=[Choice(index=0, message=message, finish_reason="stop" if done else "tool_calls")])

    request = types.SimpleNamespace(app=types.SimpleNamespace(state=types.SimpleNamespace(mcp=tools,
                                                                                          mcp_bounds=(3, 300.0))))
    body = ChatRequest(model="m", messages=QUESTION, tools=[{"type": "mcp", "server_label": "lookup"}],
                       tool_choice="required")
    reply = json.loads(asyncio.run(mcp_chat(body, request, None, model)).body)
    assert [b.tool_choice for b in asked] == ["required"] * 3 + ["none"]
    assert [len(b.messages) for b in asked] == [1, 3, 5, 7]  # each round: the call, then its result
    assert asked[-1].messages[2] == {"role": "tool", "tool_call_id": "call1", "content": secret("cats")}
    assert [c["output"] for c in reply["mcp_calls"]] == [secret("cats")] * 3
    assert reply["choices"][0]["message"]["content"] == "done" and reply["usage"]["total_tokens"] == 4 * 110


def test_chat_in_the_terminal_runs_the_calls(smollm2_path, config, calls):
    """`llamaplug chat --mcp-config`: the same loop (high/mcp_loop.py) in the terminal, each call one line."""
    before = called(calls)
    done = subprocess.run([sys.executable, "-m", "llamaplug.cli", "chat", str(smollm2_path), "--temp", "0", "-n", "48",
                           "-c", "2048", "-t", "1", "--chat-template", "chatml-tools", "--mcp-config", str(config),
                           "--tool-choice", "lookup_multiply", "--mcp-max-steps", str(MAX_STEPS)],
                          input="What is 6 times 7?\n", capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = [line.split(" ", 2) for line in done.stdout.splitlines() if line.startswith("[mcp] ")]
    assert len(shown) == MAX_STEPS and called(calls) == before + ["multiply"] * MAX_STEPS, done.stdout
    for _, name, rest in shown:
        arguments, output = rest.split(" -> ")
        given = json.loads(arguments)
        assert name == "lookup_multiply" and output == str(given["a"] * given["b"])  # the MCP server's answer


def test_responses_run_mcp_tools(server, calls):
    """/v1/responses with OpenAI's MCP tool: its mcp_list_tools and mcp_call items, read by the openai client's
    types."""
    from openai.types.responses.response_output_item import McpCall, McpListTools

    before = called(calls)
    status, body = post_status(server, "/v1/responses", {
        "input": "What is 6 times 7?",
        "tools": [{"type": "mcp", "server_label": "lookup", "allowed_tools": ["multiply"],
                   "require_approval": "never"}],
        "tool_choice": {"type": "function", "name": "lookup_multiply"}, "parallel_tool_calls": False,
        "max_output_tokens": 48, "temperature": 0}, timeout=600)
    assert status == 200, body
    listed = McpListTools.model_validate(body["output"][0])
    assert listed.server_label == "lookup"
    assert [(t.name, t.input_schema["required"]) for t in listed.tools] == [("multiply", ["a", "b"])]
    made = [McpCall.model_validate(i) for i in body["output"] if i["type"] == "mcp_call"]
    assert len(made) == MAX_STEPS and called(calls) == before + ["multiply"] * MAX_STEPS
    for call in made:
        given = json.loads(call.arguments)
        assert call.name == "multiply" and call.server_label == "lookup"
        assert call.output == str(given["a"] * given["b"])  # the MCP server's answer
    assert body["output"][-1]["type"] == "message" and body["usage"]["input_tokens"] > (MAX_STEPS + 1) * 150
    status, bad = post_status(server, "/v1/responses", {"input": "hi", "max_output_tokens": 4, "tools": [
        {"type": "mcp", "server_label": "lookup", "require_approval": "always"}]})
    assert status == 400 and bad["error"]["param"] == "tools.require_approval"


def test_responses_stream_mcp_tools(server, calls):
    """Streamed /v1/responses with an MCP tool: OpenAI's events (response.mcp_list_tools.*, response.mcp_call.*,
    output_item.added/done, the answer's text deltas), read by the openai client's stream."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="none", timeout=600, max_retries=0)
    before = called(calls)
    events = list(client.responses.create(
        input="What is 6 times 7?", stream=True, max_output_tokens=48, temperature=0, parallel_tool_calls=False,
        tools=[{"type": "mcp", "server_label": "lookup", "allowed_tools": ["multiply"], "require_approval": "never"}],
        tool_choice={"type": "function", "name": "lookup_multiply"}))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds[2:6] == ["response.output_item.added", "response.mcp_list_tools.in_progress",
                          "response.mcp_list_tools.completed", "response.output_item.done"]
    assert kinds[6:12] == ["response.output_item.added", "response.mcp_call.in_progress",
                           "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done",
                           "response.mcp_call.completed", "response.output_item.done"]
    assert called(calls) == before + ["multiply"] * MAX_STEPS
    call = events[11].item
    given = json.loads(call.arguments)
    assert call.type == "mcp_call" and call.name == "multiply" and call.output == str(given["a"] * given["b"])
    final = events[-1].response
    assert [i.type for i in final.output] == ["mcp_list_tools", "mcp_call", "message"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and final.output[-1].content[0].text == text and final.usage.input_tokens > (MAX_STEPS + 1) * 150


def test_the_loop_time_holds(smollm2_path, config, calls):
    """A call that outlasts --mcp-timeout is stopped (or never started, on a machine slow enough that the first
    round took the time): the loop ends with an answer, the reply says why, and the server goes on serving."""
    with llamaplug_server(smollm2_path, "-c", "1024", "--parallel", "1", "--chat-template", "chatml-tools",
                          "--no-responses-store", "--mcp-config", str(config), "--mcp-timeout", "10") as (port, _):
        status, reply = post_status(port, "/v1/chat/completions", {
            "messages": QUESTION,
            "tools": [{"type": "mcp", "server_label": "lookup", "allowed_tools": ["slow_multiply"]}], **ONE_CALL,
            "tool_choice": {"type": "function", "function": {"name": "lookup_slow_multiply"}}}, timeout=600)
        assert status == 200, reply
        assert reply.get("mcp_stopped") == "timeout", json.dumps(reply)
        [made] = reply["mcp_calls"]
        assert made["is_error"] and "--mcp-timeout 10 s" in made["output"]
        assert "slow_multiplied" not in called(calls)  # stopped: it sleeps 120 s
        assert reply["choices"][0]["finish_reason"] != "tool_calls"
        assert get(port, "/tools")[0] == 200  # still serving


def test_a_response_with_mcp_calls_chains():
    """previous_response_id on a response with MCP items (pure Python: the store's reading of them): the call is
    sent back as the model made it (`<server>_<tool>`) with its result; the tool listing is not sent."""
    import types

    from llamaplug.server.response_store import Kept, chained
    from llamaplug.server.responses.schemas import FunctionCallItem, FunctionCallOutputItem, ResponsesRequest

    output = [{"id": "mcpl_1", "type": "mcp_list_tools", "server_label": "lookup", "tools": []},
              {"id": "mcp_1", "type": "mcp_call", "server_label": "lookup", "name": "multiply",
               "arguments": '{"a": 6, "b": 7}', "output": "42", "error": None, "status": "completed"},
              {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "42", "annotations": []}]}]
    kept = Kept(response={"output": output}, items=[{"id": "msg_0", "type": "message", "role": "user",
                                                     "content": [{"type": "input_text", "text": "6 times 7?"}]}])
    store = types.SimpleNamespace(get=lambda owner, ident: kept if ident == "resp_1" else None)
    body, _ = chained(store, "", ResponsesRequest(input="And 7 times 8?", previous_response_id="resp_1"))
    call, result = body.input[1:3]
    assert isinstance(call, FunctionCallItem) and call.name == "lookup_multiply" and call.call_id == "mcp_1"
    assert isinstance(result, FunctionCallOutputItem) and result.output == "42" and len(body.input) == 5
