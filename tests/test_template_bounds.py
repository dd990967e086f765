"""Issue 43 part 3: a chat template that crashes or explodes fails at start, not at a request.

QA's finding: `llamaplug serve --chat-template-file T` with unbounded recursion, `messages.append(messages)`,
100k nested parentheses or 20k nested `if`s reported healthy, then died (SIGSEGV) at the first chat;
`{{ 'x' * 1000000000 }}` or a `range(1e9)` loop took it past 4 GB. Now llama.cpp's Jinja interpreter bounds
them (vendor/llama.cpp/patches/0004), and the server renders its template once before it serves
(high/template_probe.py): the start fails naming the bound. Shown against `llamaplug serve` (one model, and a
models.toml model loaded at its first request), through the library, and with every template of the pin's
models/templates still rendering.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from llamaplug_testing.servers import free_port, llamaplug_server, post_status
from llamaplug_testing.settings import THREADS

import llamaplug as lp
from llamaplug.blocks.chat_layer import ChatTemplates
from llamaplug.high.chat_template import ChatTemplate

LOOP = "{% for m in messages %}{{ m.content }}{% endfor %}"
BAD = {  # QA's templates -> the bound each passes
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recurses deeper than 512 levels"),
    "self-holding list": ("{% set x = messages.append(messages) %}{{ messages }}" + LOOP, "nests deeper than 512"),
    "parentheses": ("{{ " + "(" * 100000 + "1" + ")" * 100000 + " }}" + LOOP, "nests deeper than 128 levels"),
    "nested ifs": ("{% if true %}" * 20000 + LOOP + "{% endif %}" * 20000, "nests deeper than 128 levels"),
    "repetition": ("{{ 'x' * 1000000000 }}" + LOOP, "more than 256 MiB of text"),
    "range": ("{% for i in range(1000000000) %}{% endfor %}" + LOOP, "a list of 1000000000 items"),
}
CONVERSATION = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("name", list(BAD))
def test_the_library_raises_a_chat_template_error_naming_the_bound(llama, name):
    source, bound = BAD[name]
    start = time.monotonic()
    with pytest.raises(lp.ChatTemplateError, match=bound) as err:
        llama.create_chat_completion(CONVERSATION, max_tokens=1, chat_template=source)
    assert "chat template bound exceeded" in str(err.value)
    with pytest.raises(lp.ChatTemplateError, match=bound):
        ChatTemplate.for_model(llama.model, source).render(CONVERSATION)
    assert time.monotonic() - start < 30


def test_every_template_of_the_pin_still_renders(llama_cpp_dir):
    """The bounds are far above real templates: each of the pin's renders a 200-message conversation."""
    conversation = [{"role": ("user", "assistant")[i % 2], "content": f"message {i}"} for i in range(200)]
    paths = sorted((llama_cpp_dir / "models" / "templates").glob("*.jinja"))
    assert len(paths) > 50
    failed = {}
    for path in paths:
        try:
            ChatTemplates(None, path.read_text(), "<s>", "</s>").apply(
                {"messages": conversation, "force_pure_content": True, "reasoning_format": "none"})
        except lp.LlamaError as exc:
            if "bound exceeded" in str(exc):
                failed[path.name] = str(exc)[-200:]
    assert not failed


def _serve(*args: str, timeout: float = 120) -> tuple[int | None, str, int]:
    """`llamaplug serve` with `args` until it exits or answers /health: (exit code or None, stderr, port)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "serve", "--host", "127.0.0.1", "--port",
                             str(port), "-t", str(THREADS), "-c", "1024", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return proc.returncode, proc.stderr.read(), port
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.3)
        # healthy (the old code): its first chat is what QA saw kill it
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(
            {"messages": CONVERSATION, "max_tokens": 1}).encode(), headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=60).read()
        except OSError:
            pass
        time.sleep(1)
        return None, f"it started and served; after its first chat its exit code is {proc.poll()}", port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


@pytest.mark.parametrize("name", list(BAD))
def test_serve_fails_at_start_naming_the_bound(smollm2_path, tmp_path, name):
    source, bound = BAD[name]
    (tmp_path / "t.jinja").write_text(source)
    start = time.monotonic()
    code, stderr, _ = _serve("-m", str(smollm2_path), "--chat-template-file", str(tmp_path / "t.jinja"))
    assert code == 1, stderr[-2000:]
    assert "ChatTemplateError" in stderr and bound in stderr, stderr[-2000:]
    assert time.monotonic() - start < 60


def _post(port: int, body: dict) -> tuple[int, dict]:
    return post_status(port, "/v1/chat/completions", body)


def test_a_router_model_with_such_a_template_fails_its_load_and_the_server_stays_up(smollm2_path, tmp_path):
    """models.toml: each model loads at its first request; the bad one's load fails (500, naming the bound)."""
    (tmp_path / "good.gguf").symlink_to(smollm2_path)
    (tmp_path / "bad.gguf").symlink_to(smollm2_path)
    source = BAD["recursion"][0]
    (tmp_path / "models.toml").write_text(f'["good.gguf"]\nn_ctx = 1024\n\n["bad.gguf"]\nn_ctx = 1024\n'
                                          f"chat_template = {json.dumps(source)}\n")
    with llamaplug_server(None, "--models-dir", str(tmp_path)) as (port, proc):
        status, reply = _post(port, {"model": "bad.gguf", "messages": CONVERSATION, "max_tokens": 1})
        assert proc.poll() is None, "the server died at the bad template's first chat"
        assert status == 500 and "recurses deeper than 512 levels" in reply["error"]["message"], reply
        status, reply = _post(port, {"model": "good.gguf", "messages": CONVERSATION, "max_tokens": 1})
        assert status == 200 and proc.poll() is None
