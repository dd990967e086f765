"""Generated-token counts as llama-server gives them, on every API family, where a reply ends at the model's own
end-of-generation token, at a stop string and at max_tokens.

llama-server counts every token it sampled (its slot's n_decoded), the end-of-generation one too, in usage's
completion/output tokens, /completion's tokens_predicted and timings.predicted_n; tokens_cached is its n_past
(the last token sampled is not decoded). The same requests go to the pin's llama-server and to `llamaplug serve`;
llama-server's numbers are the reference, and each case checks that it ended the way it is named for.
"""

from __future__ import annotations

from typing import Any

import pytest
from llamaplug_testing import on_both
from test_server_contract import CTX, SLOTS, call

# SmolLM2 answers this in about 30 tokens and then ends its turn (checked below on llama-server's reply).
ASK = [{"role": "user", "content": "Say hi."}]
CHATML = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
GREEDY = {"temperature": 0, "max_tokens": 64}


def script(port: int) -> dict[str, Any]:
    chat, seen = "/v1/chat/completions", {}
    seen["chat"] = call(port, chat, {"messages": ASK, **GREEDY})
    seen["chat_stream"] = call(port, chat, {"messages": ASK, **GREEDY, "stream": True,
                                            "stream_options": {"include_usage": True}})
    seen["completions"] = call(port, "/v1/completions", {"prompt": CHATML, **GREEDY})
    seen["completions_stream"] = call(port, "/v1/completions", {"prompt": CHATML, **GREEDY, "stream": True,
                                                                "stream_options": {"include_usage": True}})
    for name, extra in (("eos", {}), ("stop", {"stop": ["help"]}), ("limit", {"n_predict": 5})):
        seen[f"completion_{name}"] = call(port, "/completion", {"prompt": CHATML, "n_predict": 64, "temperature": 0,
                                                                **extra})
    anthropic = {"model": "any", "messages": ASK, "max_tokens": 64, "temperature": 0}
    seen["messages"] = call(port, "/v1/messages", anthropic)
    seen["messages_stream"] = call(port, "/v1/messages", {**anthropic, "stream": True})
    responses = {"model": "any", "input": "Say hi.", "max_output_tokens": 64, "temperature": 0}
    seen["responses"] = call(port, "/v1/responses", responses)
    seen["responses_stream"] = call(port, "/v1/responses", {**responses, "stream": True})
    return seen


@pytest.fixture(scope="module")
def both(native_tools, smollm2_path) -> dict[str, dict[str, Any]]:
    return on_both(native_tools, smollm2_path, script, "-np", str(SLOTS), "-c", str(CTX), "--spec-type", "none")


def _body(both: dict[str, dict[str, Any]], name: str) -> tuple[Any, Any]:
    (s1, theirs), (s2, ours) = both["theirs"][name], both["ours"][name]
    assert s1 == s2 == 200, name
    return theirs, ours


def _event(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(e for e in events if e.get("type") == kind)


def test_chat_counts_the_end_token(both):
    theirs, ours = _body(both, "chat")
    assert theirs["choices"][0]["finish_reason"] == "stop"
    assert theirs["usage"]["completion_tokens"] < GREEDY["max_tokens"]  # it ended on its own
    assert ours["usage"]["completion_tokens"] == theirs["usage"]["completion_tokens"]
    assert ours["usage"]["total_tokens"] == theirs["usage"]["total_tokens"]
    assert ours["timings"]["predicted_n"] == theirs["timings"]["predicted_n"] == theirs["usage"]["completion_tokens"]
    theirs, ours = _body(both, "chat_stream")
    assert ours[-1]["usage"]["completion_tokens"] == theirs[-1]["usage"]["completion_tokens"]
    # llama-server's stream: a first delta of the role and a null content, the reply's timings on the usage chunk
    assert ours[0]["choices"][0]["delta"] == theirs[0]["choices"][0]["delta"] == {"role": "assistant",
                                                                                  "content": None}
    assert ours[-1]["timings"]["predicted_n"] == theirs[-1]["timings"]["predicted_n"]
    for events in (ours, theirs):
        assert [e for e in events if "timings" in e] == [events[-1]]


def test_completions_count_the_end_token(both):
    """(The prompt's special tokens are parsed, as llama-server does: 12 tokens, not the 29 of their text.)"""
    theirs, ours = _body(both, "completions")
    assert theirs["choices"][0]["finish_reason"] == "stop"
    assert ours["choices"][0]["text"] == theirs["choices"][0]["text"]
    assert ours["usage"] == {k: theirs["usage"][k] for k in ours["usage"]}
    theirs, ours = _body(both, "completions_stream")
    assert ours[-1]["usage"]["completion_tokens"] == theirs[-1]["usage"]["completion_tokens"]


@pytest.mark.parametrize(("case", "stop_type"), [("eos", "eos"), ("stop", "word"), ("limit", "limit")])
def test_native_completion_counts_and_n_past(both, case, stop_type):
    theirs, ours = _body(both, f"completion_{case}")
    assert theirs["stop_type"] == ours["stop_type"] == stop_type
    for key in ("tokens_predicted", "tokens_evaluated", "tokens_cached"):
        assert ours[key] == theirs[key], key
    assert ours["timings"]["predicted_n"] == theirs["timings"]["predicted_n"]


def test_messages_count_the_end_token(both):
    theirs, ours = _body(both, "messages")
    assert theirs["stop_reason"] == "end_turn"
    assert ours["usage"]["output_tokens"] == theirs["usage"]["output_tokens"]
    theirs, ours = _body(both, "messages_stream")
    assert _event(ours, "message_delta")["usage"]["output_tokens"] == \
        _event(theirs, "message_delta")["usage"]["output_tokens"]


def test_responses_count_the_end_token(both):
    theirs, ours = _body(both, "responses")
    assert theirs["status"] == "completed"
    assert ours["usage"]["output_tokens"] == theirs["usage"]["output_tokens"]
    theirs, ours = _body(both, "responses_stream")
    assert _event(ours, "response.completed")["response"]["usage"]["output_tokens"] == \
        _event(theirs, "response.completed")["response"]["usage"]["output_tokens"]
