"""Greedy text equals the native llama-completion built from the same pin, run during the test."""

from __future__ import annotations

import pytest
from llamaplug_testing import llama_completion

import llamaplug as lp

N_PREDICT = 40
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_matches_native(llama, native_tools, smollm2_path, prompt):
    ours = llama.create_completion(prompt, max_tokens=N_PREDICT, sampler=lp.SamplerChain().greedy())
    native = llama_completion(native_tools, smollm2_path, prompt, N_PREDICT, "--temp", "0")
    assert ours.stop_reason == lp.StopReason.MAX_TOKENS
    assert len(ours.tokens) == N_PREDICT >= 32
    # llama-completion ends its output with blank lines of its own; everything before is the generation.
    assert native.startswith(ours.text), f"native: {native!r}\nours:   {ours.text!r}"
    assert native[len(ours.text):].strip() == "", f"native continues: {native[len(ours.text):]!r}"


def test_default_sampler_is_greedy(llama):
    a = llama.create_completion(PROMPTS[0], max_tokens=12)
    b = llama.create_completion(PROMPTS[0], max_tokens=12, sampler=lp.SamplerChain().greedy())
    assert a.tokens == b.tokens
