"""serve --lora and /lora-adapters against the pin's llama-server, both given the same generated adapter on SmolLM2.

The reference is llama-server: the same greedy text at each scale, the same GET /lora-adapters. llama-server is
asked with cache_prompt false (its slot keeps a prompt read at another scale: not what is compared here); serve
with its cache on, so a prompt read before a POST must not be reused after it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

from fixtures.adapters import write_lora
from llamaplug_testing.servers import free_port, llama_server, llamaplug_server, post_status
from llamaplug_testing.settings import THREADS

PROMPT = "The capital of France is"
SCALE = 4.0  # large enough that the greedy text changes


def _get(port: int, path: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as resp:
        return json.loads(resp.read())


def _text(port: int, extra: dict) -> str:
    status, body = post_status(port, "/completion", {"prompt": PROMPT, "n_predict": 12, "temperature": 0,
                                                     "top_k": 1, "seed": 1, **extra})
    assert status == 200, body
    return body["content"]


def _script(port: int, extra: dict) -> dict:
    seen = {"started": _get(port, "/lora-adapters")}
    seen["at_1"] = _text(port, extra)
    for scale in (0.0, SCALE):
        status, answer = post_status(port, "/lora-adapters", [{"id": 0, "scale": scale}])
        assert status == 200 and answer == {"success": True}, answer
        seen[f"at_{scale:g}"] = _text(port, extra)
        seen[f"listed_{scale:g}"] = _get(port, "/lora-adapters")
    return seen


def test_lora_adapters_as_llama_server(native_tools, smollm2_path, tmp_path):
    adapter = write_lora(tmp_path / "lora.gguf")
    with llama_server(native_tools, smollm2_path, "--lora", str(adapter), "-c", "512") as port:
        theirs = _script(port, {"cache_prompt": False})
    with llamaplug_server(smollm2_path, "--lora", str(adapter), "-c", "512", "-np", "1") as (port, _):
        ours = _script(port, {})
        # bad ids and scales: a 400 naming the field (llama-server skips an unknown id)
        for body, field in (([{"id": 1, "scale": 1.0}], "id"), ([{"id": 0, "scale": "big"}], "scale"),
                            ({"id": 0}, "array")):
            status, answer = post_status(port, "/lora-adapters", body)
            assert status == 400 and field in answer["error"]["message"], (body, answer)
        assert _get(port, "/lora-adapters")[0]["scale"] == SCALE  # the refused POSTs changed nothing
        # a request's own lora: the scales set now pass, others are refused by name, never ignored
        # (against the same request without it: at this scale a first request and later ones differ, on both)
        assert _text(port, {"lora": [{"id": 0, "scale": SCALE}]}) == _text(port, {})
        for route, body in (("/completion", {"prompt": PROMPT}),
                            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
            status, answer = post_status(port, route, {**body, "lora": [{"id": 0, "scale": 0.5}]})
            assert status == 400 and "per-request LoRA is not supported" in answer["error"]["message"], answer

    assert ours["started"] == theirs["started"] == [{"id": 0, "path": str(adapter), "scale": 1.0,
                                                     "task_name": "", "prompt_prefix": ""}]
    for key in ("listed_0", f"listed_{SCALE:g}"):
        assert ours[key] == theirs[key]
    for key in ("at_1", "at_0", f"at_{SCALE:g}"):
        assert ours[key] == theirs[key], key
    assert ours["at_0"] != ours[f"at_{SCALE:g}"]  # the scale changed the text


def test_lora_init_without_apply_loads_at_scale_0(smollm2_path, tmp_path):
    adapter = write_lora(tmp_path / "lora.gguf")
    with llamaplug_server(smollm2_path, "-c", "512", "-np", "1") as (port, _):
        plain = _text(port, {})
        assert _get(port, "/lora-adapters") == []
    with llamaplug_server(smollm2_path, "--lora-scaled", f"{adapter}:{SCALE}", "--lora-init-without-apply",
                          "-c", "512", "-np", "1") as (port, _):
        assert _get(port, "/lora-adapters")[0]["scale"] == 0.0
        assert _text(port, {}) == plain


def test_a_bad_adapter_file_is_exit_2_naming_it(smollm2_path, tmp_path):
    narrow = write_lora(tmp_path / "narrow.gguf", n_embd=100)  # another model's shapes
    for path in (tmp_path / "missing.gguf", narrow):
        done = subprocess.run([sys.executable, "-m", "llamaplug.cli", "serve", "-m", str(smollm2_path), "--lora",
                               str(path), "--port", str(free_port()), "-t", str(THREADS)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("llamaplug serve: error:") and str(path) in last, done.stderr
