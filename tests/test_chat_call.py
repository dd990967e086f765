"""One chat call: every face builds a ChatCall and runs it with start_chat (high/chat_call.py).

The reference for a ChatRun's reply is Llama.create_chat_completion's greedy reply on SmolLM2 (the
face most tests check against llama.cpp's tools), and for its count the server's
/v1/messages/count_tokens (checked against llama-server's in test_server_contract.py).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from llamaplug_testing.settings import THREADS

import llamaplug as lp
from llamaplug.high.chat import ChatSpec, chat_templates
from llamaplug.high.chat_call import ChatCall, ChatRun, chat_results, start_chat
from llamaplug.high.chat_template import ChatTemplate
from llamaplug.server.app import create_app

SOURCES = Path(lp.__file__).parent
MESSAGES = [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Capital of France?"}]
MAX = 12


@pytest.fixture(scope="module")
def served(smollm2_path):
    """A Llama and a server app over it (the app closes the Llama when it shuts down)."""
    llama = lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=1024, n_seq_max=2, n_threads=THREADS))
    with TestClient(create_app(llama, "smol")) as client:
        yield client, llama


@pytest.fixture(scope="module")
def reference(served):
    return served[1].create_chat_completion(MESSAGES, max_tokens=MAX)


def _call(**given) -> ChatCall:
    return ChatCall(ChatSpec(MESSAGES), max_tokens=MAX, **given)


def test_result_is_create_chat_completions(served, reference):
    llama = served[1]
    got = start_chat(llama, _call()).result()
    assert reference.choices[0].message.content  # something to compare
    assert got.choices[0].message == reference.choices[0].message
    assert got.choices[0].finish_reason == reference.choices[0].finish_reason
    assert got.usage == reference.usage and got.model == reference.model


def test_stream_joins_to_the_result(served, reference):
    chunks = list(start_chat(served[1], _call()).stream())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reference.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == reference.choices[0].finish_reason


def test_async_forms(served, reference):
    llama = served[1]

    async def both():
        whole = await start_chat(llama, _call()).aresult()
        pieces = [c async for c in start_chat(llama, _call()).astream()]
        return whole, pieces

    whole, pieces = asyncio.run(both())
    assert whole.choices[0].message == reference.choices[0].message
    assert "".join(c.choices[0].delta.content or "" for c in pieces) == reference.choices[0].message.content


def test_n_replies_and_runs_in_one_batch(served, reference):
    llama = served[1]
    text = reference.choices[0].message.content
    many = start_chat(llama, _call(sampler=lp.SamplerParams(temperature=0), n=2)).result()
    assert [c.index for c in many.choices] == [0, 1]
    assert [c.message.content for c in many.choices] == [text, text]
    assert many.usage.completion_tokens == 2 * reference.usage.completion_tokens
    runs = [start_chat(llama, _call()) for _ in range(2)]
    assert [r.choices[0].message.content for r in chat_results(runs)] == [text, text]
    with pytest.raises(lp.InvalidParameterError, match="n must be"):
        ChatRun(llama, _call(n=0))


@pytest.mark.parametrize("messages", [MESSAGES, []], ids=["messages", "empty"])
def test_prompt_tokens_is_the_count_route_and_the_prompt(served, messages):
    client, llama = served
    call = ChatCall(ChatSpec(messages), allow_empty=True)
    system = [m["content"] for m in messages if m["role"] == "system"]
    body = {"model": "smol", "messages": [m for m in messages if m["role"] != "system"],
            **({"system": system[0]} if system else {})}
    answer = client.post("/v1/messages/count_tokens", json=body)
    assert answer.status_code == 200, answer.text
    counted = ChatRun(llama, call).prompt_tokens()
    assert counted == answer.json()["input_tokens"] > 0
    run = start_chat(llama, call)  # the prompt the run would decode is that long
    assert len(run.job.prompt) == counted
    run.close()


def test_chat_template_is_a_view_of_the_chat_paths_templates(served):
    model = served[1].model
    assert ChatTemplate.for_model(model)._native is chat_templates(model)
    assert ChatTemplate.for_model(model, "chatml-tools")._native is chat_templates(model, "chatml-tools")
    with pytest.raises(lp.InvalidParameterError, match="no built-in chat template"):
        ChatTemplate.for_model(model, "no-such-template")


def _calls(pattern: str) -> dict[str, int]:
    """Source files of the core that call `pattern` (a definition is not a call), with how many times."""
    found = {}
    for path in SOURCES.rglob("*.py"):
        text = path.read_text()
        n = len(re.findall(pattern, text)) - len(re.findall(r"def " + pattern, text))
        if n:
            found[path.relative_to(SOURCES).as_posix()] = n
    return found


def test_one_place_calls_the_engine_for_a_chat():
    """`grep -rn "prepare_chat(\\|chat_job(" core/src`: the job of a chat is built in one place, ChatRun.prepare
    (every face goes through a ChatCall); the old hand-assembled chat_job calls are gone."""
    assert _calls(r"\bprepare_chat\(") == {"high/chat_call.py": 1}
    assert _calls(r"\bchat_job\(") == {}
    # (the check of a custom grammar beside tools is written once, used by the chat layer and the route)
    assert sum(p.read_text().count("Cannot use custom grammar") for p in SOURCES.rglob("*.py")) == 1
