"""More of llama-server's contract (issue 32): its `verbose` debug field, the Responses stream's extra fields, and
Anthropic's empty message list, sent the same to the pin's llama-server and to `llamaplug serve`.

As tests/test_server_contract.py: both load SmolLM2 with the same slots and context, the same
requests go to each, and what llama-server answers is the reference (status, keys, greedy text,
counts), never a value written here. Where llama-server says what only it can know (its slot
id, the whole of its generation_settings), the test says so and compares the rest.
"""

from __future__ import annotations

from typing import Any

import pytest
from llamaplug_testing import on_both
from test_server_contract import CTX, SLOTS, call

QUESTION = [{"role": "user", "content": "Name three fruits."}]
GREEDY = {"temperature": 0, "max_tokens": 8}
PROMPT = "The capital of France is"


def script(port: int) -> dict[str, Any]:
    chat, completions = "/v1/chat/completions", "/v1/completions"
    seen: dict[str, Any] = {}
    seen["chat_verbose"] = call(port, chat, {"messages": QUESTION, "verbose": True, **GREEDY})
    seen["chat_verbose_stream"] = call(port, chat, {"messages": QUESTION, "verbose": True, "stream": True, **GREEDY})
    seen["chat_plain"] = call(port, chat, {"messages": QUESTION, **GREEDY})
    seen["completions_verbose"] = call(port, completions, {"prompt": PROMPT, "verbose": True, **GREEDY})
    seen["completions_verbose_stream"] = call(port, completions, {"prompt": PROMPT, "verbose": True, "stream": True,
                                                                  **GREEDY})
    # a question no earlier request asked, read with progress and per-token timings
    seen["responses_progress"] = call(port, "/v1/responses", {
        "model": "any", "input": "Which planet is the largest one?", "stream": True, "max_output_tokens": 6,
        "temperature": 0, "return_progress": True, "timings_per_token": True})
    seen["responses_plain"] = call(port, "/v1/responses", {"model": "any", "input": "Name three fruits.",
                                                           "stream": True, "max_output_tokens": 6, "temperature": 0})
    anthropic = {"model": "any", "max_tokens": 8, "temperature": 0}
    seen["messages_empty"] = call(port, "/v1/messages", {**anthropic, "messages": []})
    seen["messages_empty_system"] = call(port, "/v1/messages", {**anthropic, "messages": [],
                                                                "system": "You are a bot."})
    seen["messages_empty_stream"] = call(port, "/v1/messages", {**anthropic, "messages": [], "stream": True})
    seen["messages_missing"] = call(port, "/v1/messages", anthropic)
    return seen


@pytest.fixture(scope="module")
def both(native_tools, smollm2_path) -> dict[str, dict[str, Any]]:
    return on_both(native_tools, smollm2_path, script, "-np", str(SLOTS), "-c", str(CTX), "--spec-type", "none")


# What only llama-server can say (its slot), and what each server names its model.
UNSHARED = {"id_slot", "model", "generation_settings", "timings", "prompt"}


def _same_verbose(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert set(ours) == set(theirs)
    for key in set(theirs) - UNSHARED:
        assert ours[key] == theirs[key], key
    assert set(ours["timings"]) == set(theirs["timings"])
    # ours names the sampling it has (a subset of llama-server's knobs), with llama-server's names and values
    assert set(ours["generation_settings"]) <= set(theirs["generation_settings"])
    for key in ("temperature", "top_k", "n_predict", "max_tokens", "stop", "stream", "repeat_last_n"):
        assert ours["generation_settings"][key] == theirs["generation_settings"][key], key


def test_verbose_chat_reply_carries_the_completion_result(both):
    (s1, theirs), (s2, ours) = both["theirs"]["chat_verbose"], both["ours"]["chat_verbose"]
    assert s1 == s2 == 200
    _same_verbose(ours["__verbose"], theirs["__verbose"])
    assert ours["__verbose"]["prompt"] == theirs["__verbose"]["prompt"]  # the template as rendered
    assert ours["__verbose"]["content"] == ours["choices"][0]["message"]["content"]
    assert "__verbose" not in both["ours"]["chat_plain"][1]  # only when asked
    assert "__verbose" not in both["theirs"]["chat_plain"][1]


def test_verbose_chat_stream_says_it_on_the_finishing_chunk(both):
    found = {}
    for side in ("theirs", "ours"):
        status, events = both[side]["chat_verbose_stream"]
        assert status == 200
        marked = [e for e in events if "__verbose" in e]
        assert len(marked) == 1 and marked[0]["choices"][0]["finish_reason"], side
        found[side] = marked[0]["__verbose"]
    _same_verbose(found["ours"], found["theirs"])
    assert found["ours"]["content"] == "" and found["ours"]["tokens_predicted"] == GREEDY["max_tokens"]


def test_verbose_completions_whole_and_streamed(both):
    (s1, theirs), (s2, ours) = both["theirs"]["completions_verbose"], both["ours"]["completions_verbose"]
    assert s1 == s2 == 200
    _same_verbose(ours["__verbose"], theirs["__verbose"])
    assert ours["__verbose"]["prompt"] == theirs["__verbose"]["prompt"] == PROMPT
    streamed = {}
    for side in ("theirs", "ours"):
        status, events = both[side]["completions_verbose_stream"]
        assert status == 200
        with_choices = [e for e in events if e["choices"]]
        assert all("__verbose" in e for e in with_choices), side
        streamed[side] = [e["__verbose"] for e in with_choices]
    *pieces, last = streamed["ours"]
    *their_pieces, their_last = streamed["theirs"]
    assert pieces == their_pieces  # each piece: its text, its token, the counts so far
    _same_verbose(last, their_last)


def _progress(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["prompt_progress"] for e in events if e["type"] == "response.in_progress" and "prompt_progress" in e]


def test_responses_stream_progress_and_timings_per_token(both):
    for side in ("theirs", "ours"):
        status, events = both[side]["responses_progress"]
        assert status == 200
        deltas = [e for e in events if e["type"] == "response.output_text.delta"]
        assert deltas and all("timings" in e for e in deltas), side
        assert set(deltas[-1]["timings"]) == set(events[-1]["timings"])
        progress = _progress(events)
        assert progress and set(progress[-1]) == {"total", "cache", "processed", "time_ms"}, side
        # the progress comes before the reply's first item
        first_item = next(i for i, e in enumerate(events) if e["type"] == "response.output_item.added")
        last_progress = max(i for i, e in enumerate(events) if "prompt_progress" in e)
        assert last_progress < first_item
    theirs, ours = (_progress(both[s]["responses_progress"][1])[-1] for s in ("theirs", "ours"))
    assert ours["total"] == theirs["total"] == ours["processed"] == theirs["processed"]
    assert 0 <= ours["cache"] < ours["total"]  # (the system prompt both share with earlier requests may be cached)
    texts = {s: "".join(e["delta"] for e in both[s]["responses_progress"][1]
                        if e["type"] == "response.output_text.delta") for s in ("theirs", "ours")}
    assert texts["ours"] == texts["theirs"]


def test_responses_stream_without_the_fields_has_none_of_them(both):
    for side in ("theirs", "ours"):
        status, events = both[side]["responses_plain"]
        assert status == 200
        assert not _progress(events), side
        assert not any("timings" in e for e in events[:-1]), side  # only the last event's


@pytest.mark.parametrize("name", ["messages_empty", "messages_empty_system"])
def test_an_empty_message_list_is_answered_as_llama_server_does(both, name):
    (s1, theirs), (s2, ours) = both["theirs"][name], both["ours"][name]
    assert s1 == s2 == 200, (theirs, ours)
    assert ours["content"][0]["text"] == theirs["content"][0]["text"]
    assert ours["stop_reason"] == theirs["stop_reason"]

    def prompt_tokens(usage: dict[str, int]) -> int:
        return usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)

    assert prompt_tokens(ours["usage"]) == prompt_tokens(theirs["usage"])
    assert ours["usage"]["output_tokens"] == theirs["usage"]["output_tokens"]


def test_an_empty_message_list_streams(both):
    texts = {}
    for side in ("theirs", "ours"):
        status, events = both[side]["messages_empty_stream"]
        assert status == 200
        assert events[-1]["type"] == "message_stop"
        texts[side] = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert texts["ours"] == texts["theirs"] != ""
    assert texts["ours"] == both["ours"]["messages_empty"][1]["content"][0]["text"]


def test_no_message_list_at_all_is_a_bad_request(both):
    (s1, theirs), (s2, ours) = both["theirs"]["messages_missing"], both["ours"]["messages_missing"]
    # llama-server throws (500, "'messages' is required"); a body without a required field is a 400 here,
    # in Anthropic's error shape (docs/serving.md's table lists this difference)
    assert s1 == 500 and "messages" in theirs["error"]["message"]
    assert s2 == 400 and ours["type"] == "error" and "messages" in ours["error"]["message"]
