"""LangChain's `ChatOllama` (langchain-ollama) pointed at `llamaplug serve`, with no change but its base_url.

invoke, stream and a tool call through bind_tools, each compared with the same request sent by
the official `ollama` client and by the openai client to /v1/chat/completions on the same server
(greedy: the same text, the same call). The served model is SmolLM2 with the "chatml-tools"
template (models.toml), as tests/test_ollama.py serves it: its own template has no place for tools.
"""

from __future__ import annotations

import json

import openai
import pytest
from llamaplug_testing import llamaplug_server
from llamaplug_testing.chat_replies import TIME_TOOL, few_shot

ollama = pytest.importorskip("ollama", reason="the official Ollama client (requirements-reference.txt)")
langchain_ollama = pytest.importorskip("langchain_ollama", reason="LangChain's ChatOllama "
                                       "(langchain-ollama, requirements-reference.txt)")
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402 - after the importorskip above

FRUITS = [{"role": "user", "content": "Name three fruits."}]
N = 12


@pytest.fixture(scope="module")
def served(tmp_path_factory, smollm2_path):
    folder = tmp_path_factory.mktemp("models")
    (folder / smollm2_path.name).symlink_to(smollm2_path)
    (folder / "models.toml").write_text(f'["{smollm2_path.name}"]\nchat_template = "chatml-tools"\n')
    with llamaplug_server(None, "--models-dir", str(folder), "--parallel", "2", "-c", "2048", "-t", "1") as (port, _):
        yield port, smollm2_path.name


@pytest.fixture(scope="module")
def clients(served):
    port, name = served
    url = f"http://127.0.0.1:{port}"
    return {"url": url, "name": name, "ollama": ollama.Client(host=url),
            "oai": openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)}


def _pairs(messages: list[dict]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


def test_invoke_and_stream_equal_the_ollama_client_and_v1(clients):
    name = clients["name"]
    chat = langchain_ollama.ChatOllama(model=name, base_url=clients["url"], temperature=0, num_predict=N)
    want = clients["oai"].chat.completions.create(model=name, messages=FRUITS, max_tokens=N,
                                                  temperature=0).choices[0].message.content
    direct = clients["ollama"].chat(model=name, messages=FRUITS, options={"temperature": 0, "num_predict": N})
    reply = chat.invoke(_pairs(FRUITS))
    assert isinstance(reply, AIMessage)
    assert reply.content == direct.message.content == want != ""
    # the final line's counts, as LangChain reads them
    assert reply.usage_metadata["output_tokens"] == direct.eval_count == N
    assert reply.usage_metadata["input_tokens"] == direct.prompt_eval_count > 0
    assert reply.response_metadata["done_reason"] == "length"
    chunks = list(chat.stream(_pairs(FRUITS)))
    assert len(chunks) > 1 and "".join(c.content for c in chunks) == want


def test_bind_tools_gives_the_call_v1_gives(clients):
    name = clients["name"]
    messages = few_shot("hermes")  # SmolLM2-135M calls a tool only after seeing it done
    want = clients["oai"].chat.completions.create(model=name, messages=messages, tools=[TIME_TOOL], max_tokens=64,
                                                  temperature=0).choices[0].message
    assert want.tool_calls, want  # (the comparison below must be about a call)
    want_calls = [(c.function.name, json.loads(c.function.arguments)) for c in want.tool_calls]
    direct = clients["ollama"].chat(model=name, messages=messages, tools=[TIME_TOOL],
                                    options={"temperature": 0, "num_predict": 64})
    assert [(c.function.name, c.function.arguments) for c in direct.message.tool_calls] == want_calls
    chat = langchain_ollama.ChatOllama(model=name, base_url=clients["url"], temperature=0, num_predict=64)
    with_tools = chat.bind_tools([TIME_TOOL])
    reply = with_tools.invoke(_pairs(messages))
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == want_calls
    streamed = None
    for chunk in with_tools.stream(_pairs(messages)):
        streamed = chunk if streamed is None else streamed + chunk
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == want_calls
    # the call's result sent back as LangChain sends it: a reply comes
    after = with_tools.invoke([*_pairs(messages), reply,
                               ToolMessage(content="noon", tool_call_id=reply.tool_calls[0]["id"] or "call")])
    assert isinstance(after, AIMessage) and (after.content or after.tool_calls)
