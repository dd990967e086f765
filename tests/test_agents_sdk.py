"""The OpenAI Agents SDK (openai-agents, pinned in requirements-reference.txt) unchanged against `llamaplug serve`.

An agent with two function tools and a handoff, run through both of the SDK's OpenAI models (Chat Completions
and Responses), whole (Runner.run) and streamed (Runner.run_streamed), and the Responses model's turns chained
with previous_response_id (across a restart of the server too; never from another API key). SmolLM2 would not
call a tool on its own: each turn is forced with the SDK's own settings, ModelSettings(tool_choice="required")
with one tool enabled per turn (the SDK's is_enabled), so the run is tool, tool, handoff, answer. What is
asserted is what the SDK documents a run gives: its items and stream events, the tool outputs fed back, the
agent the run ended on, and final_output of the agent's output_type.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import openai
import pytest
from agents import (
    Agent,
    HandoffCallItem,
    HandoffOutputItem,
    MessageOutputItem,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIConversationsSession,
    OpenAIResponsesModel,
    RunContextWrapper,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    handoff,
    set_tracing_disabled,
)
from llamaplug_testing import RestartableServer
from pydantic import BaseModel

set_tracing_disabled(True)  # no traces to OpenAI's servers
KEYS = ("key-a", "key-b")
ORDER = ("get_weather", "add", "transfer_to_reporter")  # one forced call per turn, in this order
ITEMS = [ToolCallItem, ToolCallOutputItem, ToolCallItem, ToolCallOutputItem, HandoffCallItem, HandoffOutputItem,
         MessageOutputItem]


@dataclasses.dataclass
class Progress:
    called: list[str] = dataclasses.field(default_factory=list)


def turn_of(name: str):
    def enabled(ctx: RunContextWrapper[Progress], _agent) -> bool:
        return ctx.context.called == list(ORDER[:ORDER.index(name)])
    return enabled


@function_tool(is_enabled=turn_of("get_weather"))
def get_weather(ctx: RunContextWrapper[Progress], city: str) -> str:
    """The weather in a city."""
    ctx.context.called.append("get_weather")
    return f"It is 21 degrees and sunny in {city}."


@function_tool(is_enabled=turn_of("add"))
def add(ctx: RunContextWrapper[Progress], a: int, b: int) -> int:
    """Add two integers."""
    ctx.context.called.append("add")
    return a + b


class Report(BaseModel):
    temperature: int


def agent(model) -> Agent:
    reporter = Agent(name="Reporter", instructions="Report the temperature.", model=model, output_type=Report,
                     model_settings=ModelSettings(max_tokens=24, temperature=0))
    return Agent[Progress](
        name="Assistant", instructions="Use the tools.", model=model, tools=[get_weather, add],
        handoffs=[handoff(reporter, is_enabled=turn_of("transfer_to_reporter"),
                          on_handoff=lambda ctx: ctx.context.called.append("transfer_to_reporter"))],
        # one call a turn (a second call cut by max_tokens would be half a call); kept forced after a call. After
        # its call the chat layer's grammar lets SmolLM2 write up to ~25 tokens of whitespace before the end: a
        # limit inside them is a "length" reply (an incomplete response), as llama-server's, so room for them
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=80,
                                     temperature=0),
        reset_tool_choice=False)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return tmp_path_factory.mktemp("agents") / "responses.sqlite3"


@pytest.fixture(scope="module")
def serve(smollm2_path, db):
    """The module's server; test_a_restart_between_two_chained_turns restarts it (same port, same file)."""
    with RestartableServer(smollm2_path, "-c", "4096", "--parallel", "2", "--chat-template", "chatml-tools",
                           "--api-key", ",".join(KEYS), "--responses-db", str(db)) as serve:
        yield serve


@pytest.fixture(scope="module")
def server(serve):
    return serve.port


def client(port: int, key: str = KEYS[0]) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=1800)


def models(port: int, key: str = KEYS[0]) -> dict[str, object]:
    oai = client(port, key)
    return {"chat": OpenAIChatCompletionsModel(model="smollm2", openai_client=oai),
            "responses": OpenAIResponsesModel(model="smollm2", openai_client=oai)}


def check_run(result, city: str) -> None:
    """The run's items as the SDK documents them: each tool called and its output fed back, the handoff, the
    Reporter's answer as a Report."""
    assert [type(i) for i in result.new_items] == ITEMS
    weather, weather_out, adding, sum_out, to_reporter, handed, _ = result.new_items
    assert weather.raw_item.name == "get_weather" and city in weather.raw_item.arguments
    assert weather_out.output == f"It is 21 degrees and sunny in {city}."
    args = adding.raw_item
    assert args.name == "add"
    given = json.loads(args.arguments)
    assert sum_out.output == given["a"] + given["b"]
    assert to_reporter.raw_item.name == "transfer_to_reporter"
    assert handed.source_agent.name == "Assistant" and handed.target_agent.name == "Reporter"
    # the outputs went back to the model: the input the next turn was given carries them
    fed = [i for i in result.to_input_list() if i.get("type") == "function_call_output"]
    assert [str(i["output"]) for i in fed][:2] == [weather_out.output, str(sum_out.output)]
    assert result.last_agent.name == "Reporter"
    assert isinstance(result.final_output, Report)
    assert len(result.raw_responses) == 4  # weather, add, handoff, answer: one model call each


@pytest.fixture(scope="module")
def whole(server):
    """Runner.run on each model, once for the module."""
    async def both():
        named = models(server)
        runs = [Runner.run(agent(model), "What is the weather in Paris, and what is 2 + 3?", context=Progress(),
                           max_turns=6) for model in named.values()]
        return dict(zip(named, await asyncio.gather(*runs)))  # the server's two slots, side by side
    return asyncio.run(both())


@pytest.mark.parametrize("name", ["chat", "responses"])
def test_a_run(whole, name):
    check_run(whole[name], "Paris")
    if name == "responses":  # kept by the server (store defaults to true)
        assert whole[name].last_response_id.startswith("resp_")


async def streamed(model, city: str, **kwargs):
    run = Runner.run_streamed(agent(model), f"What is the weather in {city}, and what is 4 + 5?",
                              context=Progress(), max_turns=6, **kwargs)
    names, agents_seen, raw = [], [], 0
    async for event in run.stream_events():
        if event.type == "raw_response_event":
            raw += 1
        elif event.type == "run_item_stream_event":
            names.append(event.name)
        elif event.type == "agent_updated_stream_event":
            agents_seen.append(event.new_agent.name)
    return run, names, agents_seen, raw


@pytest.mark.parametrize("name", ["chat", "responses"])
def test_a_streamed_run(server, whole, name):
    kwargs = {"previous_response_id": whole[name].last_response_id} if name == "responses" else {}
    run, names, agents_seen, raw = asyncio.run(streamed(models(server)[name], "Rome", **kwargs))
    assert names == ["tool_called", "tool_output", "tool_called", "tool_output", "handoff_requested",
                     "handoff_occured", "message_output_created"]
    assert agents_seen == ["Assistant", "Reporter"] and raw > 7  # the model's own events, streamed through
    check_run(run, "Rome")
    if name == "responses":  # each turn chained on the one before, back to the first run's last response
        oai = openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key=KEYS[0], max_retries=0)
        chain, at = [], run.last_response_id
        while at is not None:
            chain.append(at)
            at = oai.responses.retrieve(at).previous_response_id
        assert whole[name].last_response_id in chain
        items = oai.responses.input_items.list(run.last_response_id, order="asc", limit=100).data
        assert items[0].type == "message" and "Paris" in items[0].content[0].text  # the first run's question


def test_another_keys_previous_response_id_is_refused(server, whole):
    model = models(server, KEYS[1])["responses"]
    with pytest.raises(openai.BadRequestError) as refused:
        asyncio.run(Runner.run(agent(model), "Hi", context=Progress(), max_turns=2,
                               previous_response_id=whole["responses"].last_response_id))
    assert refused.value.code == "previous_response_not_found"


def test_a_conversation_id_and_a_conversations_session(server):
    # the SDK's two uses of OpenAI's Conversations API: Runner.run's conversation_id (the Responses model sends
    # `conversation`, the server keeps the turns) and OpenAIConversationsSession (the SDK keeps them there itself)
    reporter = Agent(name="Reporter", instructions="Report the temperature.", model=models(server)["responses"],
                     output_type=Report, model_settings=ModelSettings(max_tokens=24, temperature=0))

    async def runs():
        oai = client(server)
        conv = await oai.conversations.create()
        first = await Runner.run(reporter, "It is 21 degrees.", conversation_id=conv.id)
        second = await Runner.run(reporter, "And now?", conversation_id=conv.id)
        kept = [i async for i in oai.conversations.items.list(conv.id, order="asc")]
        session = OpenAIConversationsSession(openai_client=oai)
        third = await Runner.run(reporter, "It is 21 degrees.", session=session)
        return first, second, kept, third, await session.get_items()

    first, second, kept, third, in_session = asyncio.run(runs())
    assert all(isinstance(r.final_output, Report) for r in (first, second, third))
    assert [(i.type, i.role) for i in kept] == [("message", "user"), ("message", "assistant")] * 2
    said = [i.content[0].text for i in kept]
    assert said[0::2] == ["It is 21 degrees.", "And now?"]
    assert [Report.model_validate_json(t) for t in said[1::2]] == [first.final_output, second.final_output]
    assert [i["role"] for i in in_session] == ["user", "assistant"]
    assert in_session[0]["content"][0]["text"] == "It is 21 degrees."
    assert Report.model_validate_json(in_session[1]["content"][0]["text"]) == third.final_output


def test_a_restart_between_two_chained_turns(serve, whole):
    first = whole["responses"].last_response_id
    # the server that ran the first turns stops, its process gone, before one on the same file starts
    assert serve.restart().returncode is not None
    model = models(serve.port)["responses"]
    reporter = Agent(name="Reporter", instructions="Report the temperature.", model=model, output_type=Report,
                     model_settings=ModelSettings(max_tokens=24, temperature=0))
    result = asyncio.run(Runner.run(reporter, "And now?", previous_response_id=first))
    assert isinstance(result.final_output, Report)
    oai = openai.OpenAI(base_url=f"http://127.0.0.1:{serve.port}/v1", api_key=KEYS[0], max_retries=0)
    assert oai.responses.retrieve(result.last_response_id).previous_response_id == first
