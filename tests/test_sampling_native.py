"""Sampled text (temperature > 0, a seed) equals the pin's own llama-completion and llama-server, run here.

Greedy parity is test_greedy_native.py; this is the random half: the same seed, temperature and
truncation samplers must draw the same tokens as llama.cpp's common sampler does, through
`create_completion`'s keywords (the chain SamplerParams builds) and through hand-built SamplerChains
of the samplers whose own effect was otherwise unchecked: dynamic temperature (temp_ext with a
range) and adaptive_p. Each case also differs from the chain without that sampler on the same seed,
so the comparison would notice the sampler being dropped or ignored.
"""

from __future__ import annotations

import re

import pytest
from llamaplug_testing import llama_completion, llama_server, post_json

import llamaplug as lp

PROMPT = "Once upon a time"
N = 40
SEED = 7
TEMP = 0.9
# llama.cpp's defaults, spelt out on both sides so neither relies on the other's defaults.
TRUNCATION = {"top_k": 40, "top_p": 0.95, "min_p": 0.05}
CTX = 2048


def native_completion(bin_dir, model, *flags: str) -> str:
    """llama-completion's generated text for PROMPT (its prompt is not echoed)."""
    return llama_completion(bin_dir, model, PROMPT, N, *flags, ctx=CTX)


def assert_same_text(ours: lp.Completion, native: str) -> None:
    # llama-completion ends with blank lines (and "[end of text]" after an EOS) of its own.
    assert native.startswith(ours.text), f"native: {native!r}\nours:   {ours.text!r}"
    assert native[len(ours.text):].strip() in ("", "[end of text]"), f"native goes on: {native[len(ours.text):]!r}"
    assert len(ours.tokens) >= N // 2  # enough draws for a different RNG stream to show


def flags(temp: float = TEMP, seed: int = SEED) -> list[str]:
    return ["-s", str(seed), "--temp", str(temp), "--top-k", str(TRUNCATION["top_k"]),
            "--top-p", str(TRUNCATION["top_p"]), "--min-p", str(TRUNCATION["min_p"])]


@pytest.fixture(scope="module")
def native_server(native_tools, smollm2_path):
    with llama_server(native_tools, smollm2_path, "-c", str(CTX)) as port:
        yield port


@pytest.mark.parametrize(("seed", "temp"), [(SEED, TEMP), (3, 1.3)])
def test_sampled_completion_equals_llama_completion_and_llama_server(llama, native_tools, smollm2_path,
                                                                   native_server, seed, temp):
    ours = llama.create_completion(PROMPT, N, temperature=temp, seed=seed, **TRUNCATION)
    assert_same_text(ours, native_completion(native_tools, smollm2_path, *flags(temp, seed)))
    served = post_json(native_server, "/completion", {"prompt": PROMPT, "n_predict": N, "seed": seed,
                                                      "temperature": temp, "cache_prompt": False, **TRUNCATION})
    assert served["content"] == ours.text
    greedy = llama.create_completion(PROMPT, N, sampler="greedy")
    assert ours.tokens != greedy.tokens  # the temperature was sampled from, not ignored


def test_dynamic_temperature_chain_equals_llama_completion(llama, native_tools, smollm2_path, native_server):
    def chain(delta: float) -> lp.SamplerChain:
        return (lp.SamplerChain(seed=SEED).top_k(40).top_p(0.95).min_p(0.05)
                .temp_ext(TEMP, delta, 1.5).dist())

    ours = llama.create_completion(PROMPT, N, sampler=chain(0.6))
    native = native_completion(native_tools, smollm2_path, *flags(), "--samplers", "top_k;top_p;min_p;temperature",
                               "--dynatemp-range", "0.6", "--dynatemp-exp", "1.5")
    assert_same_text(ours, native)
    served = post_json(native_server, "/completion", {
        "prompt": PROMPT, "n_predict": N, "seed": SEED, "temperature": TEMP, "dynatemp_range": 0.6,
        "dynatemp_exponent": 1.5, "cache_prompt": False, "samplers": ["top_k", "top_p", "min_p", "temperature"],
        **TRUNCATION})
    assert served["content"] == ours.text
    # The same keywords through SamplerParams' chain draw the same tokens.
    keywords = llama.create_completion(PROMPT, N, temperature=TEMP, seed=SEED, dynatemp_range=0.6,
                                       dynatemp_exponent=1.5, samplers=["top_k", "top_p", "min_p", "temperature"],
                                       **TRUNCATION)
    assert keywords.tokens == ours.tokens
    assert llama.create_completion(PROMPT, N, sampler=chain(0.0)).tokens != ours.tokens  # the range matters


def test_adaptive_p_chain_equals_llama_completion(llama, native_tools, smollm2_path, native_server):
    ours = llama.create_completion(PROMPT, N, sampler=lp.SamplerChain(seed=SEED).min_p(0.05).temp(TEMP)
                                   .adaptive_p(0.3, 0.9))
    native = native_completion(native_tools, smollm2_path, "-s", str(SEED), "--temp", str(TEMP), "--min-p", "0.05",
                               "--samplers", "min_p;temperature;adaptive_p", "--adaptive-target", "0.3",
                               "--adaptive-decay", "0.9")
    assert_same_text(ours, native)
    served = post_json(native_server, "/completion", {
        "prompt": PROMPT, "n_predict": N, "seed": SEED, "temperature": TEMP, "min_p": 0.05, "adaptive_target": 0.3,
        "adaptive_decay": 0.9, "cache_prompt": False, "samplers": ["min_p", "temperature", "adaptive_p"]})
    assert served["content"] == ours.text
    plain = llama.create_completion(PROMPT, N, sampler=lp.SamplerChain(seed=SEED).min_p(0.05).temp(TEMP).dist())
    assert plain.tokens != ours.tokens  # adaptive_p chose, not dist


LAZY_PROMPT = "The capital of France is"
LAZY_TRIGGER = "Paris"
# From the trigger on, the grammar holds; llama.cpp feeds it the text from the trigger's match.
LAZY_GRAMMAR = 'root ::= "Paris" [.,] " It is " ("big" | "small" | "old") "."'


def test_grammar_lazy_is_free_before_its_trigger_and_bound_after_it_as_llama_server(llama, native_server):
    free = llama.create_completion(LAZY_PROMPT, N, sampler="greedy").text
    assert LAZY_TRIGGER in free  # greedy says it unprompted: the trigger comes from the model's free text
    lazy = lp.SamplerChain().grammar_lazy(LAZY_GRAMMAR, trigger_patterns=[LAZY_TRIGGER]).greedy()
    ours = llama.create_completion(LAZY_PROMPT, N, sampler=lazy)
    before = free[:free.index(LAZY_TRIGGER)]
    assert ours.text.startswith(before + LAZY_TRIGGER)  # nothing constrained before the trigger
    assert re.fullmatch(r"Paris[.,] It is (big|small|old)\.", ours.text[len(before):]), ours.text
    assert not free.startswith(ours.text) and ours.stop_reason == lp.StopReason.EOS  # bound: its end, then EOS
    served = post_json(native_server, "/completion", {
        "prompt": LAZY_PROMPT, "n_predict": N, "temperature": 0, "cache_prompt": False, "grammar": LAZY_GRAMMAR,
        "grammar_lazy": True, "grammar_triggers": [{"type": 2, "value": LAZY_TRIGGER}]})  # 2: a pattern
    assert served["content"] == ours.text
