"""`llamaplug serve` as a drop-in for llama-server: one script, written for the pin's llama-server, run on both.

The script (`llama_server_script`) does what a user's curl or editor does: /completion
(text, tokens, stop words, a stream), /tokenize with_pieces, /detokenize, /apply-template,
/props, /slots with save/restore/erase, bad requests, and the `openai` client with a
model name neither server has ("gpt-4o-mini"). Both servers load SmolLM2 with the same
threads, slots and context; the answers must have the same keys and types, the same
greedy text, the same statuses and the same error bodies. Where llama-server answers a
bad request with a 500 (its JSON parser's exception), ours is a 400 in the same shape.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from fixtures.tiny_gguf import FIM, write_tiny_model, write_tiny_reranker
from llamaplug_testing import THREADS, free_port, llama_server, llamaplug_server
from llamaplug_testing.servers import wait_healthy

CTX = 1024  # one slot of 1024 positions on both
SCRIPT_PROMPT = "The capital of France is"
PROGRESS_PROMPT = "Once upon a time in a land far away there lived a brave knight"  # asked once: nothing cached
EOS_PROMPT = "<|im_start|>user\nSay only the word yes.<|im_end|>\n<|im_start|>assistant\n"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def call(port: int, path: str, body: Any = None, raw: bytes | None = None, method: str | None = None
         ) -> tuple[int, Any]:
    """One request as `curl -d` sends it (form Content-Type, JSON body): (status, parsed body)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode()
    if text.startswith("data: "):
        return status, [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    return status, json.loads(text)


def tool(port: int, folder: Path, name: str, params: Any, stream: bool = False, **headers: str
         ) -> tuple[int, Any]:
    """One POST /tools call (serve --tools all) with x-tool-cwd `folder`: (status, body with `folder` as DIR)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tools", method="POST", data=json.dumps(
        {"tool": name, "params": params, "stream": stream}).encode(), headers={"x-tool-cwd": str(folder), **{
            k.replace("_", "-"): v for k, v in headers.items()}})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode()
    text = text.replace(str(folder), "DIR")
    if stream:
        return status, [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    return status, json.loads(text)


def tools_script(port: int, folder: Path) -> dict[str, tuple[int, Any]]:
    """The built-in tools' round trip in `folder`: write, read, edit (and its refusals), search, a shell."""
    folder.mkdir()
    dup = [{"old_text": "dup", "new_text": "x"}]
    return {
        "write": tool(port, folder, "write_file", {"path": "sub/a.txt", "content": "dup\ndup\nkeep \u201cq\u201d  \n"}),
        "read": tool(port, folder, "read_file", {"path": "sub/a.txt", "append_loc": True, "start_line": 2}),
        "edit_not_unique": tool(port, folder, "edit_file", {"path": "sub/a.txt", "edits": dup}),
        "edit_fuzzy": tool(port, folder, "edit_file", {"path": "sub/a.txt", "edits": [
            {"old_text": "dup\ndup", "new_text": "one"}, {"old_text": 'keep "q"', "new_text": "kept"}]}),
        "read_after": tool(port, folder, "read_file", {"path": "sub/a.txt"}),
        "glob": tool(port, folder, "file_glob_search", {"path": ".", "type": "all"}),
        "glob_bad_type": tool(port, folder, "file_glob_search", {"path": ".", "type": "bogus"}),
        "grep": tool(port, folder, "grep_search", {"path": ".", "pattern": "k.pt", "context_lines": 1}),
        "shell": tool(port, folder, "exec_shell_command", {"command": "cat sub/a.txt; exit 3"}),
        "shell_stream": tool(port, folder, "exec_shell_command", {"command": "echo hello"}, stream=True),
        "no_path": tool(port, folder, "read_file", {}),
        "path_type": tool(port, folder, "read_file", {"path": 5}),
        "unknown_tool": tool(port, folder, "no_such_tool", {}),
        "bad_runtime": tool(port, folder, "get_info", {}, x_tool_runtime="ssh:-oProxyCommand=x"),
    }


def llama_server_script(port: int) -> dict[str, tuple[int, Any]]:
    """What a script written for llama-server sees, request by request."""
    seen = {
        "completion": call(port, "/completion", {"prompt": SCRIPT_PROMPT, "n_predict": 12, "temperature": 0}),
        "completions": call(port, "/completions", {"prompt": SCRIPT_PROMPT, "n_predict": 12, "temperature": 0}),
        "completion_stop": call(port, "/completion", {"prompt": "List: one, two,", "n_predict": 24,
                                                      "temperature": 0, "stop": [","]}),
        "completion_tokens": call(port, "/completion", {"prompt": [504, 3575, 282, 4649, 314], "n_predict": 6,
                                                        "temperature": 0, "cache_prompt": True, "id_slot": 0}),
        "completion_stream": call(port, "/completion", {"prompt": SCRIPT_PROMPT, "n_predict": 12,
                                                        "temperature": 0, "stream": True}),
        # llama-server's prompt object, alone and in a list beside token ids; multimodal_data without a projector
        "completion_object": call(port, "/completion", {"prompt": {"prompt_string": SCRIPT_PROMPT}, "n_predict": 12,
                                                        "temperature": 0}),
        "completion_objects": call(port, "/completion", {"prompt": [[504, 3575, 282, 4649, 314], {
            "prompt_string": "The capital of France is"}], "n_predict": 4, "temperature": 0}),
        "completion_media": call(port, "/completion", {"prompt": {"prompt_string": "A <__media__>",
                                                                  "multimodal_data": "iVBORw0KGgo="}}),
        # greedy SmolLM2 ends this reply with <|im_end|> at its 7th token; ignore_eos bans every EOG token
        "eos": call(port, "/completion", {"prompt": EOS_PROMPT, "n_predict": 10, "temperature": 0}),
        "ignore_eos": call(port, "/completion", {"prompt": EOS_PROMPT, "n_predict": 10, "temperature": 0,
                                                 "ignore_eos": True}),
        "one_token": call(port, "/completion", {"prompt": SCRIPT_PROMPT, "n_predict": 1, "temperature": 0}),
        "progress": call(port, "/completion", {"prompt": PROGRESS_PROMPT, "n_predict": 2, "temperature": 0,
                                               "stream": True, "return_progress": True, "timings_per_token": True}),
        "tokenize": call(port, "/tokenize", {"content": "Hello world, héllo <|im_start|>"}),
        "tokenize_pieces": call(port, "/tokenize", {"content": "Hello world, héllo", "with_pieces": True}),
        "detokenize": call(port, "/detokenize", {"tokens": [19556, 905, 28]}),
        "apply_template": call(port, "/apply-template", {"messages": [{"role": "user", "content": "Hi there"}]}),
        # SmolLM2's template has no place for tools: rendered without them, as llama-server renders it
        "apply_template_tools": call(port, "/apply-template", {"messages": [{"role": "user", "content": "Hi"}],
                                                               "tools": [WEATHER]}),
        "apply_template_no_tools": call(port, "/apply-template", {"messages": [{"role": "user", "content": "Hi"}],
                                                                  "tools": []}),
        "props": call(port, "/props", method="GET"),
        "slots": call(port, "/slots", method="GET"),
        "slot_save": call(port, "/slots/0?action=save", {"filename": "script-slot.bin"}),
        "slot_restore": call(port, "/slots/0?action=restore", {"filename": "script-slot.bin"}),
        "slot_erase": call(port, "/slots/0?action=erase", {}),
        "slot_traversal": call(port, "/slots/0?action=save", {"filename": "../outside.bin"}),
        "slot_absolute": call(port, "/slots/0?action=restore", {"filename": "/etc/passwd"}),
        "slot_bad_id": call(port, "/slots/x?action=erase", {}),
        "bad_prompt_type": call(port, "/completion", {"prompt": 5}),
        "bad_n_predict_type": call(port, "/completion", {"prompt": "a", "n_predict": "many"}),
        "no_prompt": call(port, "/completion", {}),
        "too_long": call(port, "/completion", {"prompt": "hello " * 3000, "n_predict": 1}),
        "bad_json": call(port, "/completion", raw=b"{not json"),
    }
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(model="gpt-4o-mini", max_tokens=12, temperature=0,
                                          messages=[{"role": "user", "content": "Name a fruit."}])
    text = client.completions.create(model="gpt-4o-mini", prompt=SCRIPT_PROMPT, max_tokens=12, temperature=0)
    seen["openai_chat"] = (200, chat.choices[0].message.content)
    seen["openai_completion"] = (200, text.choices[0].text)
    return seen


@pytest.fixture(scope="module")
def both(native_tools, smollm2_path, tmp_path_factory) -> dict[str, dict[str, tuple[int, Any]]]:
    """The script's answers from the pin's llama-server and from llamaplug serve (each with its own save folder)."""
    folders = [tmp_path_factory.mktemp(name) for name in ("theirs", "ours")]
    with llama_server(native_tools, smollm2_path, "-c", str(CTX), "--slot-save-path", f"{folders[0]}/",
                      "--metrics", "--tools", "all") as port:
        theirs = llama_server_script(port)
        theirs["tools"] = (200, tools_script(port, folders[0] / "tools"))
        theirs["metrics_started"] = _metrics_started(port)
    with llamaplug_server(smollm2_path, "-np", "1", "-c", str(CTX), "--spec-type", "none", "--slot-save-path",
                          str(folders[1]), "--metrics", "--jinja", "--tools", "all") as (port, _):
        ours = llama_server_script(port)
        ours["tools"] = (200, tools_script(port, folders[1] / "tools"))
        ours["metrics"] = (200, _metrics(port))
        ours["metrics_started"] = _metrics_started(port)
    assert not (folders[1].parent / "outside.bin").exists()
    return {"theirs": theirs, "ours": ours}


def _metrics_started(port: int) -> str | None:
    """/metrics' Process-Start-Time-Unix header (llama-server's: when the server started, Unix seconds)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.headers.get("Process-Start-Time-Unix")


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


def _shape(value: Any) -> Any:
    """Keys and JSON types (a float that is whole may come as an int from one side: both are numbers)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    return "number" if isinstance(value, (int, float)) else type(value).__name__


COMPLETION_KEYS = {"index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted", "tokens_evaluated",
                   "generation_settings", "prompt", "has_new_line", "truncated", "stop_type", "stopping_word",
                   "tokens_cached", "timings"}


@pytest.mark.parametrize("name", ["completion", "completions", "completion_stop", "completion_tokens"])
def test_completion_has_llama_servers_shape_and_greedy_text(both, name):
    (s1, theirs), (s2, ours) = both["theirs"][name], both["ours"][name]
    assert s1 == s2 == 200
    assert COMPLETION_KEYS <= set(theirs) and COMPLETION_KEYS <= set(ours)
    for key in COMPLETION_KEYS - {"generation_settings"}:
        assert _shape(ours[key]) == _shape(theirs[key]), key
    assert set(ours["timings"]) == set(theirs["timings"])
    for key in ("content", "stop", "stop_type", "stopping_word", "tokens_predicted", "tokens_evaluated",
                "tokens_cached", "has_new_line"):
        assert ours[key] == theirs[key], key


def test_a_prompt_object_is_read_as_llama_server_reads_it(both):
    for side in ("theirs", "ours"):
        status, whole = both[side]["completion_object"]
        assert status == 200 and whole["content"] == both["theirs"]["completion"][1]["content"], side
        status, listed = both[side]["completion_objects"]
        assert status == 200 and [r["content"] for r in listed] == [listed[0]["content"]] * 2, side
    assert [r["content"] for r in both["ours"]["completion_objects"][1]] == [
        r["content"] for r in both["theirs"]["completion_objects"][1]]
    (s1, theirs), (s2, ours) = both["theirs"]["completion_media"], both["ours"]["completion_media"]
    assert s1 == s2 == 400 and ours["error"]["message"] == theirs["error"]["message"]


def test_ignore_eos_bans_every_end_of_generation_token_as_llama_server(both):
    theirs, ours = both["theirs"], both["ours"]
    banned = {e["token"] for e in theirs["ignore_eos"][1]["generation_settings"]["logit_bias"]}
    assert banned  # SmolLM2's EOG tokens, each at -inf (null in JSON)
    for side in (theirs, ours):
        (s1, free), (s2, ignoring) = side["eos"], side["ignore_eos"]
        assert s1 == s2 == 200
        assert free["stop_type"] == "eos" and free["tokens_predicted"] < 10
        assert free["generation_settings"]["logit_bias"] == []
        assert ignoring["stop_type"] == "limit" and ignoring["tokens_predicted"] == 10
        assert {e["token"] for e in ignoring["generation_settings"]["logit_bias"]} == banned
        assert all(e["bias"] is None for e in ignoring["generation_settings"]["logit_bias"])
    assert ours["ignore_eos"][1]["content"] == theirs["ignore_eos"][1]["content"]


def test_generation_rates_count_decode_steps_as_llama_server(both):
    """The first token comes from the prompt's last batch: a rate over n - 1 decode steps (0 for one token)."""
    for side in ("theirs", "ours"):
        one = both[side]["one_token"][1]["timings"]
        assert one["predicted_n"] == 1 and one["predicted_per_second"] == one["predicted_per_token_ms"] == 0.0, side
        t = both[side]["ignore_eos"][1]["timings"]
        assert t["predicted_n"] == 10
        assert abs(t["predicted_per_second"] - 1e3 / t["predicted_ms"] * 9) < 1e-6, side
        assert abs(t["predicted_per_token_ms"] - t["predicted_ms"] / 9) < 1e-9, side


def test_stop_word_is_named(both):
    ours = both["ours"]["completion_stop"][1]
    assert ours["stop_type"] == "word" and ours["stopping_word"] == ","


def test_stream_is_llama_servers(both):
    (_, theirs), (_, ours) = both["theirs"]["completion_stream"], both["ours"]["completion_stream"]
    whole = both["theirs"]["completion"][1]["content"]
    for events in (theirs, ours):
        assert "".join(e["content"] for e in events) == whole
        assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
        assert {"index", "content", "tokens", "stop", "tokens_predicted", "tokens_evaluated"} <= set(events[0])
    assert _shape(ours[0]) == _shape(theirs[0])
    assert COMPLETION_KEYS <= set(ours[-1])


def test_return_progress_streams_llama_servers_prompt_progress(both):
    """The pin's test_metrics_timings_on_prompt_progress on both: a /completion stream with return_progress gives a
    prompt_progress piece when the prompt starts and after each batch (one here: n_batch 2048), before its first
    token, with the timings so far (timings_per_token). On the old code serve sent none. (llama-server's piece says
    "tokens": [0], a token it never sampled; ours [].)"""
    (s1, theirs), (s2, ours) = both["theirs"]["progress"], both["ours"]["progress"]
    assert s1 == s2 == 200
    for events in (theirs, ours):
        progress = [e for e in events if "prompt_progress" in e]
        assert progress == events[:len(progress)] and all(e["content"] == "" for e in progress)
        first = progress[0]["timings"]
        assert first["prompt_n"] == first["predicted_n"] == 0 and first["prompt_ms"] == first["predicted_ms"] == 0
        assert progress[-1]["timings"]["prompt_ms"] > 0
    assert [e["prompt_progress"] | {"time_ms": 0} for e in ours if "prompt_progress" in e] == \
        [e["prompt_progress"] | {"time_ms": 0} for e in theirs if "prompt_progress" in e]
    assert [_shape(e | {"tokens": []}) for e in ours[:3]] == [_shape(e | {"tokens": []}) for e in theirs[:3]]


@pytest.mark.parametrize("name", ["tokenize", "tokenize_pieces", "detokenize", "apply_template",
                                  "apply_template_tools", "apply_template_no_tools"])
def test_token_and_template_endpoints_answer_the_same(both, name):
    assert both["ours"][name] == both["theirs"][name]


def test_props_and_slots_have_llama_servers_keys(both):
    (_, theirs), (_, ours) = both["theirs"]["props"], both["ours"]["props"]
    for key in ("total_slots", "model_path", "chat_template", "bos_token", "eos_token", "endpoint_slots",
                "endpoint_metrics"):
        assert ours[key] == theirs[key], key
    for key in ("model_alias", "build_info", "is_sleeping"):
        assert _shape(ours[key]) == _shape(theirs[key]), key
    for key in ("default_generation_settings", "modalities"):
        assert set(ours[key]) == set(theirs[key]), key
    assert ours["default_generation_settings"]["n_ctx"] == theirs["default_generation_settings"]["n_ctx"]
    (_, theirs), (_, ours) = both["theirs"]["slots"], both["ours"]["slots"]
    assert len(ours) == len(theirs) == 1
    for key in ("id", "n_ctx", "is_processing", "speculative"):
        assert ours[0][key] == theirs[0][key], key
    # ours also says where the slot's last prompt found its cached tokens (test_disk_cache and
    # test_engine_stays_up check the values)
    assert ours[0]["prompt_cache"]["origin"] in ("none", "slot", "ram", "disk"), ours
    assert isinstance(ours[0]["prompt_cache"]["n_cached"], int), ours


@pytest.mark.parametrize("name, keys", [
    ("slot_save", {"id_slot", "filename", "n_saved", "n_written", "timings"}),
    ("slot_restore", {"id_slot", "filename", "n_restored", "n_read", "timings"}),
    ("slot_erase", {"id_slot", "n_erased"}),
])
def test_slot_actions(both, name, keys):
    (s1, theirs), (s2, ours) = both["theirs"][name], both["ours"][name]
    assert s1 == s2 == 200
    assert set(theirs) == set(ours) == keys
    assert ours["id_slot"] == theirs["id_slot"] == 0
    if "filename" in keys:
        assert ours["filename"] == theirs["filename"] == "script-slot.bin"


SLOT_PROMPT = ("The history of the world, told in a few words: first there was the sea, then the land, then "
               "the people who walked on it and wrote down what they saw.")


def _saved_and_restored(start: Any, folder: Path) -> dict[str, Any]:
    """A prompt on slot 0, the slot saved; then in a fresh server on the same folder, the slot restored and the
    same prompt asked again. What each step answered."""
    folder.mkdir()
    ask = {"prompt": SLOT_PROMPT, "n_predict": 8, "temperature": 0, "cache_prompt": True, "id_slot": 0}
    with start(folder) as port:
        first = call(port, "/completion", ask)
        save = call(port, "/slots/0?action=save", {"filename": "kept.bin"})
    with start(folder) as port:
        restore = call(port, "/slots/0?action=restore", {"filename": "kept.bin"})
        again = call(port, "/completion", ask)
    return {"first": first, "save": save, "restore": restore, "again": again}


def test_a_restored_slot_serves_its_prompt_from_the_cache_as_llama_servers(native_tools, smollm2_path,
                                                                          tmp_path):
    """Save after a prompt, restore in a new process: the same prompt is then read from the cache (cache_n > 0,
    which a fresh server's first request shows as 0) and gives the same greedy text, as llama-server does."""
    @contextlib.contextmanager
    def theirs(folder: Path):
        with llama_server(native_tools, smollm2_path, "-c", str(CTX), "--slot-save-path", f"{folder}/") as port:
            yield port

    @contextlib.contextmanager
    def ours(folder: Path):
        with llamaplug_server(smollm2_path, "-np", "1", "-c", str(CTX), "--slot-save-path", str(folder),
                              "--spec-type", "none") as (port, _):
            yield port

    seen = {name: _saved_and_restored(start, tmp_path / name) for name, start in (("theirs", theirs),
                                                                                   ("ours", ours))}
    for name, steps in seen.items():
        assert all(status == 200 for status, _ in steps.values()), (name, steps)
        first, again = steps["first"][1], steps["again"][1]
        assert first["timings"]["cache_n"] == 0, name  # nothing cached in a new process
        assert again["timings"]["cache_n"] > 0, (name, again["timings"])  # only the restore can have put it there
        assert again["content"] == first["content"], name
        assert steps["restore"][1]["n_restored"] == steps["save"][1]["n_saved"] > 0, (name, steps)
    mine, native = seen["ours"], seen["theirs"]
    assert mine["again"][1]["content"] == native["again"][1]["content"]
    assert mine["again"][1]["timings"]["cache_n"] == native["again"][1]["timings"]["cache_n"]
    assert mine["save"][1]["n_saved"] == native["save"][1]["n_saved"]


@pytest.mark.parametrize("name", ["slot_traversal", "slot_absolute", "slot_bad_id", "bad_prompt_type",
                                  "bad_n_predict_type", "no_prompt", "too_long"])
def test_bad_requests_have_llama_servers_status_and_error_body(both, name):
    (s1, theirs), (s2, ours) = both["theirs"][name], both["ours"][name]
    assert s1 == s2 == 400, (theirs, ours)
    assert set(ours["error"]) == set(theirs["error"]), (theirs, ours)
    assert ours["error"]["code"] == 400 and ours["error"]["type"] == theirs["error"]["type"]
    if name in ("slot_traversal", "slot_absolute", "too_long"):
        assert ours == theirs  # the very same body: message, and n_prompt_tokens/n_ctx for too_long


def test_bad_json_is_a_400_in_llama_servers_shape(both):
    (s1, theirs), (s2, ours) = both["theirs"]["bad_json"], both["ours"]["bad_json"]
    assert s1 == 500 and s2 == 400  # llama-server's parser exception is a 500; a bad body is the client's fault
    assert set(ours["error"]) == set(theirs["error"]) == {"code", "message", "type"}
    assert ours["error"]["type"] == "invalid_request_error"


def test_openai_client_with_any_model_name_gets_the_same_text(both):
    for name in ("openai_chat", "openai_completion"):
        assert both["ours"][name] == both["theirs"][name], name


def test_metrics_have_llama_servers_names_with_a_model_label(both, smollm2_path):
    text = both["ours"]["metrics"][1]
    label = f'{{model="{Path(smollm2_path).stem}"}}'  # the served name: the file's, without .gguf (issue 48)
    for name in ("prompt_tokens_total", "tokens_predicted_total", "requests_processing", "requests_deferred",
                 "n_decode_total"):
        assert f"llamacpp:{name}{label} " in text, name
    predicted = next(line for line in text.splitlines() if line.startswith("llamacpp:tokens_predicted_total"))
    assert float(predicted.split()[-1]) > 0
    for side in ("theirs", "ours"):  # llama-server's header, which the pin's test_metrics.py asks for: despite
        # its name, its start on the monotonic clock in microseconds
        assert 0 < int(both[side]["metrics_started"]) < time.monotonic_ns() // 1000, side


def test_rerank_and_infill_equal_llama_servers(native_tools, tmp_path):
    """/v1/rerank (and /rerank) on the tiny generated reranker, /infill on the tiny FIM model: the same answers."""
    reranker = write_tiny_reranker(tmp_path / "tiny-reranker.gguf")
    fim = write_tiny_model(tmp_path / "tiny-fim.gguf", FIM)
    rerank = {"query": "what is a cat", "documents": ["a cat is a small animal", "paris", "cats and dogs"],
              "top_n": 2}
    infill = {"input_prefix": "hello", "input_suffix": " world", "n_predict": 6, "temperature": 0}
    answers: dict[str, list[Any]] = {"theirs": [], "ours": []}
    with llama_server(native_tools, reranker, "-c", "128", "--reranking") as port:
        answers["theirs"] += [call(port, "/v1/rerank", rerank), call(port, "/rerank", {**rerank, "top_n": 3})]
    with llamaplug_server(reranker, "-np", "1", "-c", "128", "--reranking", "--spec-type", "none") as (port, _):
        answers["ours"] += [call(port, "/v1/rerank", rerank), call(port, "/rerank", {**rerank, "top_n": 3})]
    with llama_server(native_tools, fim, "-c", "128") as port:
        answers["theirs"].append(call(port, "/infill", infill))
    with llamaplug_server(fim, "-np", "1", "-c", "128", "--spec-type", "none") as (port, _):
        answers["ours"].append(call(port, "/infill", infill))
    for (s1, theirs), (s2, ours) in zip(answers["theirs"][:2], answers["ours"][:2]):
        assert s1 == s2 == 200
        assert set(ours) == set(theirs) and ours["usage"] == theirs["usage"]
        assert [r["index"] for r in ours["results"]] == [r["index"] for r in theirs["results"]]
        for a, b in zip(ours["results"], theirs["results"]):
            assert a["relevance_score"] == pytest.approx(b["relevance_score"], rel=1e-3, abs=1e-4)
    (s1, theirs), (s2, ours) = answers["theirs"][2], answers["ours"][2]
    assert s1 == s2 == 200
    assert ours["content"] == theirs["content"] and ours["stop_type"] == theirs["stop_type"]
    assert COMPLETION_KEYS <= set(ours)


def test_api_key_guards_every_route_but_health_and_a_dropped_stream_frees_its_slot(smollm2_path):
    with llamaplug_server(smollm2_path, "-np", "1", "-c", "256", "--api-key", "s3cret", "--metrics") as (port, _):
        for path in ("/props", "/slots", "/metrics", "/v1/models", "/models"):
            status, body = call(port, path, method="GET")
            assert status == 401, path
        status, body = call(port, "/tokenize", {"content": "hi"})
        assert status == 401 and body["error"]["code"] == 401 and body["error"]["type"] == "authentication_error"
        assert call(port, "/health", method="GET")[0] == 200
        for header in ("Bearer s3cret", "s3cret"):  # as llama-server, with or without "Bearer "
            req = urllib.request.Request(f"http://127.0.0.1:{port}/props", headers={"Authorization": header})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 200
        key = {"Authorization": "Bearer s3cret"}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/completion", json.dumps({"prompt": "Count: 1, 2, 3,", "n_predict": 2000,
                                                        "temperature": 0, "stream": True}), key)
        resp = conn.getresponse()
        for _ in range(3):
            assert resp.fp.readline()  # a few events arrive
        assert _processing(port, key) == 1
        conn.sock.close()
        conn.close()
        deadline = time.monotonic() + 10
        while _processing(port, key) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _processing(port, key) == 0


def _processing(port: int, headers: dict[str, str]) -> float:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        line = next(x for x in resp.read().decode().splitlines() if x.startswith("llamacpp:requests_processing{"))
    return float(line.split()[-1])


@pytest.mark.parametrize("argv, dest, value", [
    (["-n", "7"], "n_predict", 7), (["--n-predict", "7"], "n_predict", 7), (["-a", "gpt"], "alias", ["gpt"]),
    (["-cram", "64"], "cache_ram", 64), (["--slot-save-path", "/tmp"], "slot_save_path", "/tmp"),
    (["-c", "512", "-np", "2", "-t", "1"], "parallel", 2), (["-ub", "64"], "n_ubatch", 64),
    (["--ubatch-size", "64"], "n_ubatch", 64), (["--cache-exact"], "cache_exact", True),
    (["--sleep-idle-seconds", "5"], "sleep_idle", 5), (["--kv-unified"], "kv_unified", True),
    (["-kvu", "-no-kvu"], "kv_unified", False), (["--kv_unified", "--ctx_size=512"], "ctx_size", 512),  # '_' as '-'
])
def test_llama_server_flags_we_have(argv, dest, value):
    from llamaplug.cli import parser

    no_ops = ["--jinja", "--metrics", "--embeddings", "-cb", "--no-cache-idle-slots"]
    assert getattr(parser().parse_args(["serve", *argv, *no_ops]), dest) == value


def test_metrics_answer_501_without_the_flag_as_llama_servers(smollm2_path):
    """The pin's test_metrics_disabled: llama-server without --metrics answers /metrics 501; so does serve."""
    from fastapi.testclient import TestClient

    from llamaplug import LlamaParams
    from llamaplug.cli import parser
    from llamaplug.server.app import create_app_for
    from llamaplug.server.registry import ModelRegistry, ModelSpec

    assert parser().parse_args(["serve"]).endpoint_metrics is False
    assert parser().parse_args(["serve", "--metrics"]).endpoint_metrics is True
    registry = ModelRegistry(specs=[ModelSpec("m", LlamaParams(smollm2_path))])  # nothing is loaded
    with TestClient(create_app_for(registry, endpoint_metrics=False)) as http:
        resp = http.get("/metrics")
        assert resp.status_code == 501
        assert resp.json()["error"]["message"] == "This server does not support metrics endpoint. Start it with " \
                                                  "`--metrics`"


@pytest.mark.parametrize("flag", ["--ssl-key-file", "--yarn-beta-fast", "--spm-infill", "--threads-batch",
                                  "--tools-runtime", "--cache-idle-slots", "--backend-sampling"])
def test_a_llama_server_flag_we_lack_is_an_error_naming_it(flag, capsys):
    from llamaplug.cli import parser

    with pytest.raises(SystemExit):
        parser().parse_args(["serve", flag, "1"])
    assert f"{flag} is a llama-server flag" in capsys.readouterr().err


def test_builtin_tools_answer_as_llama_servers(both):
    """serve --tools all: each tool call of the round trip gets llama-server's status, and its answer where the
    tool ran (a 4xx's body is in each server's own error shape: ours names the field, theirs is its JSON parser's)."""
    theirs, ours = both["theirs"]["tools"][1], both["ours"]["tools"][1]
    assert theirs["bad_runtime"][0] == 500 and ours["bad_runtime"][0] == 400  # a client's bad header: not our fault
    assert "x-tool-runtime" in ours["bad_runtime"][1]["error"]["message"]
    for name, (status, body) in theirs.items():
        assert name == "bad_runtime" or ours[name][0] == status, (name, ours[name], body)
        if status == 200:
            assert ours[name][1] == body, name
    assert ours["edit_fuzzy"][1]["edits_applied"] == 2  # the round trip did edit (equal to llama-server's above)
    assert "params.path" in ours["no_path"][1]["error"]["message"]
    assert "params.path" in ours["path_type"][1]["error"]["message"]


def test_single_model_serves_any_name_and_several_keep_the_404(llama):
    """As llama-server: one model answers to any `model`; with several, an unknown name is a 404 naming them.

    (Moved here from test_server.py's unknown_model case, whose 404 was the one-model behaviour before.)
    """
    from llamaplug.server.errors import ApiError
    from llamaplug.server.registry import ModelRegistry, Served

    one = ModelRegistry([Served("smol", llama)])
    assert one.resolve("gpt-4o-mini") is one.resolve(None) is one.resolve("smol")
    two = ModelRegistry([Served("smol", llama), Served("other", llama)])
    assert two.resolve("other").id == "other"
    with pytest.raises(ApiError) as err:
        two.resolve("gpt-4o-mini")
    assert err.value.status == 404 and err.value.param == "model" and "'smol', 'other'" in str(err.value)


def _metric(text: str, name: str) -> float:
    """llama-server's unlabelled line of `name` (the pin's test_sleep.py reads exactly one)."""
    lines = [line for line in text.splitlines() if line.startswith(f"llamacpp:{name} ")]
    assert len(lines) == 1, name
    return float(lines[0].split()[1])


@pytest.mark.parametrize("port", ["x", "99999", "-1", "80.5"])
def test_a_bad_aip_http_port_is_refused_naming_it(port):
    """AIP_MODE=PREDICTION's port is read before serve binds: a wrong one is a LlamaError naming the variable."""
    from llamaplug import InvalidParameterError
    from llamaplug.server.gcp import Gcp

    with pytest.raises(InvalidParameterError, match="AIP_HTTP_PORT"):
        Gcp.from_env({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": port})
    assert Gcp.from_env({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "9000"}).port == 9000


def test_sleep_metrics_and_gcp_predict_as_the_pins_suite_asks(smollm2_path):
    """What the pin's test_sleep.py, test_metrics.py and test_compat_gcp.py ask of llama-server, on one serve:
    --sleep-idle-seconds (a sleeping model's /props answers without waking it), llama-server's unlabelled
    /metrics lines with the throughput of what finished since the last scrape, and Vertex AI's /predict with
    AIP_MODE=PREDICTION (AIP_HTTP_PORT replacing --port)."""
    port = free_port()
    env = {**os.environ, "AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "serve", "-m", str(smollm2_path), "--port", "1",
                             "-t", str(THREADS), "-np", "1", "--sleep-idle-seconds", "2", "--metrics"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(proc, port, "llamaplug serve")
        status, body = call(port, "/predict", {"instances": [
            {"@requestFormat": "chatCompletions", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
            {"@requestFormat": "/tokenize", "content": "Hello"}, {"@requestFormat": "nope"}]})
        assert status == 200
        chat, tokens, unknown = body["predictions"]
        assert chat["choices"][0]["message"]["role"] == "assistant" and tokens["tokens"]
        assert unknown["error"]["message"] == "no handler registered for @requestFormat: nope"
        done = call(port, "/completion", {"prompt": SCRIPT_PROMPT, "n_predict": 4, "ignore_eos": True})[1]
        text = _metrics(port)
        assert _metric(text, "tokens_predicted_total") == chat["timings"]["predicted_n"] + 4
        assert _metric(text, "prompt_tokens_total") == chat["timings"]["prompt_n"] + done["timings"]["prompt_n"]
        assert _metric(text, "prompt_seconds_total") > 0 and _metric(text, "n_busy_slots_per_decode") == 1
        assert _metric(text, "predicted_tokens_seconds") > 0  # the two requests since the start
        awake = _metrics(port)
        assert _metric(awake, "predicted_tokens_seconds") == 0  # none since the last scrape
        deadline = time.monotonic() + 30
        while not (props := call(port, "/props", method="GET")[1])["is_sleeping"]:
            assert time.monotonic() < deadline, "never slept"
            time.sleep(0.2)
        assert props["model_alias"] == Path(smollm2_path).stem and props["total_slots"] == 1
        assert call(port, "/props", method="GET")[1]["is_sleeping"]  # /props does not wake it
        # asleep, /metrics is the last awake scrape, though /props was polled since (the pin's
        # test_server_sleep_read_only_endpoints; on the old code the HTTP counter moved and the gauges' lines went)
        assert _metrics(port) == awake
        assert call(port, "/props", method="GET")[1]["is_sleeping"]  # nor does /metrics
        assert call(port, "/tokenize", {"content": "Hello"})[0] == 200
        assert not call(port, "/props", method="GET")[1]["is_sleeping"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
