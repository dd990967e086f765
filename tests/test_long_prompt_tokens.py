"""A long prompt is tokenized in pieces (blocks/long_text.py): the pin's llama-tokenize's tokens, in linear time,
and the work stops between pieces when its request is cancelled (issue 43, part 2).

llama.cpp's own split at special tokens is quadratic in their number in one text: 10,000 chat messages took
5.8 s, 30,000 turns 43 s, in llama-server as in llamaplug before this.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from llamaplug.blocks.cancellation import CancelFlag
from llamaplug.errors import RequestCancelledError
from llamaplug.high.chat import ChatSpec, check_messages, plan_chat


def _messages(n: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"w{i % 97}"} for i in range(n)]


def _prompt(llama, n: int) -> str:
    return plan_chat(llama, ChatSpec(_messages(n))).params["prompt"]


def _native(bin_dir, model_path, tmp_path, text: str, *flags: str) -> list[int]:
    path = tmp_path / "prompt.txt"
    path.write_bytes(text.encode())
    out = subprocess.run([str(bin_dir / "llama-tokenize"), "-m", str(model_path), "-f", str(path), "--ids",
                          "--log-disable", *flags], capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# Texts over long_text.MIN_BYTES: a chat prompt; the same with whitespace, other special texts and a lone
# special text inside messages; one where a longer special text occurs (no cut: tokenized whole).
TRICKY = ["  spaced  ", "\n\n", "<|im_end|> inside", "é ü 日本", "<|im_start|>", " <file_sep> ", "\t", "a" * 300]


@pytest.mark.parametrize("kind", ["chat", "tricky", "longer-special"])
def test_pieces_give_llama_tokenize_s_tokens(llama, smollm2_path, native_tools, tmp_path, kind):
    if kind == "chat":
        text = _prompt(llama, 6000)
    else:
        messages = [{"role": "user", "content": TRICKY[i % len(TRICKY)] + str(i)} for i in range(3000)]
        text = plan_chat(llama, ChatSpec(messages)).params["prompt"]
        if kind == "longer-special":
            text += "<|endoftext|>"
    assert len(text.encode()) > 64 * 1024
    model = llama.model
    assert model.tokenize(text, model.add_bos, special=True) == _native(native_tools, smollm2_path, tmp_path, text)
    assert model.tokenize(text, model.add_bos, special=False) == _native(native_tools, smollm2_path, tmp_path, text,
                                                                         "--no-parse-special")


def test_a_long_chat_tokenizes_in_linear_time(llama):
    model = llama.model
    prompt = _prompt(llama, 30_000)  # 43 s in one llama_tokenize call (10,000: 10 s here)
    started, cpu = time.perf_counter(), time.process_time()
    tokens = model.tokenize(prompt, model.add_bos, special=True)
    took, used = time.perf_counter() - started, time.process_time() - cpu
    print(f"30,000 turns ({len(prompt.encode())} bytes, {len(tokens)} tokens): {took:.2f} s, CPU {used:.2f} s")
    assert used < 8  # CPU seconds (a loaded test machine stretches the wall clock): ~2.5 in pieces


def test_cancelled_work_stops_between_steps(llama):
    model = llama.model
    prompt = _prompt(llama, 3000)
    flag = CancelFlag()
    flag.cancel()
    with pytest.raises(RequestCancelledError):
        flag.run(lambda: model.tokenize(prompt, model.add_bos, special=True))
    with pytest.raises(RequestCancelledError):
        flag.run(lambda: check_messages(_messages(10)))
    with pytest.raises(RequestCancelledError):
        flag.run(lambda: llama.embed(["one", "two"]))
    # without a flag, or with one not set, the same work runs
    assert model.tokenize(prompt, model.add_bos, special=True) == CancelFlag().run(
        lambda: model.tokenize(prompt, model.add_bos, special=True))
