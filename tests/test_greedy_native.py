"""Greedy text equals the native llama-completion built from the same pin, run during the test."""

from __future__ import annotations

import subprocess

import pytest
from llamaplug_testing import THREADS

import llamaplug as lp

N_PREDICT = 40
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
]


def native_completion(bin_dir, model, prompt: str) -> str:
    # llama-completion writes through common_log's worker thread and ends with two blank lines of its own; once, in
    # a whole-suite run, its stdout stopped one token and those lines short ('# 333.' where it always prints
    # '# 333.3\n\n'): a cut output is the tool's, so it is asked again rather than compared.
    for _ in range(3):
        result = subprocess.run(
            [str(bin_dir / "llama-completion"), "-m", str(model), "-p", prompt, "-n", str(N_PREDICT),
             "-no-cnv", "--temp", "0", "-t", str(THREADS), "-c", "2048", "--no-display-prompt", "--simple-io",
             "--no-warmup"],
            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        if result.stdout.endswith("\n\n"):
            break
    return result.stdout


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_matches_native(llama, native_tools, smollm2_path, prompt):
    ours = llama.create_completion(prompt, max_tokens=N_PREDICT, sampler=lp.SamplerChain().greedy())
    native = native_completion(native_tools, smollm2_path, prompt)
    assert ours.stop_reason == lp.StopReason.MAX_TOKENS
    assert len(ours.tokens) == N_PREDICT >= 32
    # llama-completion ends its output with blank lines of its own; everything before is the generation.
    assert native.startswith(ours.text), f"native: {native!r}\nours:   {ours.text!r}"
    assert native[len(ours.text):].strip() == "", f"native continues: {native[len(ours.text):]!r}"


def test_default_sampler_is_greedy(llama):
    a = llama.create_completion(PROMPTS[0], max_tokens=12)
    b = llama.create_completion(PROMPTS[0], max_tokens=12, sampler=lp.SamplerChain().greedy())
    assert a.tokens == b.tokens
