"""A chain always selects, and what would abort llama.cpp's sampler is a LlamaError.

llama_sampler_sample GGML_ASSERTs that a sampler selected a candidate: a chain without
greedy/dist at its end (seed 001's own), an empty chain, or one that masked every token
killed the process. Each case runs in a fresh interpreter, so an abort fails the test
instead of killing pytest.
"""

from __future__ import annotations

import textwrap

import pytest
from llamaplug_testing import THREADS, run_isolated

PRELUDE = f"""
import json
import llamaplug as lp
from llamaplug.catalog import default_model

def load(**kw):
    return lp.Llama.load(lp.LlamaParams(default_model(), n_ctx=512, n_threads={THREADS}, **kw))

def seed001_chain(**kw):
    return lp.SamplerChain(**kw).temp(0.8).top_p(0.95, 1).min_p(0.05, 1).penalties(64, 1.1, 0.0, 0.0)

def outcome(fn):
    try:
        result = fn()
    except lp.LlamaError as e:
        return {{"error": type(e).__name__, "message": str(e), "field": getattr(e, "field", None)}}
    return {{"result": result}}
"""


def child(body: str) -> dict:
    return run_isolated(PRELUDE + textwrap.dedent(body) + "\nprint('RESULT ' + json.dumps(out))", result=True)


def test_seed001_chain_completes_and_a_seed_repeats_its_text():
    out = child("""
        llama = load(seed=42)
        a = llama.create_completion("Once upon a time", 24, sampler=seed001_chain())
        b = llama.create_completion("Once upon a time", 24, sampler=seed001_chain())
        own = seed001_chain(seed=42)
        c = llama.create_completion("Once upon a time", 24, sampler=own)
        out = {"a": a.tokens, "b": b.tokens, "c": c.tokens, "default_seed": own.default_seed}
    """)
    assert out["a"] and out["a"] == out["b"]  # dist(LlamaParams.seed) was appended: same seed, same text
    assert out["c"] == out["a"]  # the chain's own seed 42 equals LlamaParams.seed 42
    assert out["default_seed"] == 42


def test_the_appended_dist_uses_llamaparams_seed():
    out = child("""
        texts = {}
        for seed in (1, 2, 1):
            llama = load(seed=seed)
            texts.setdefault(seed, []).append(llama.create_completion("Once upon a time", 32,
                                                                      sampler=seed001_chain()).tokens)
            llama.close()
        out = {str(k): v for k, v in texts.items()}
    """)
    assert out["1"][0] == out["1"][1]
    assert out["1"][0] != out["2"][0]  # 32 tokens at temperature 0.8: two seeds part ways


@pytest.mark.parametrize(("label", "code", "error", "fragment"), [
    ("empty chain", "llama.create_completion('Hi', 4, sampler=lp.SamplerChain())",
     "InvalidParameterError", "empty"),
    ("one sampler that selects nothing", """
        llama.context.decode(llama.model.tokenize("Hi"))
        return lp.LlamaSampler.temp(0.8).sample(llama.context, -1)""", "SamplingError", "selected no token"),
    ("-inf logit bias on every token", """
        bias = {t: float("-inf") for t in range(llama.model.n_vocab)}
        return llama.create_completion('Hi', 4, sampler=lp.SamplerChain().logit_bias(bias).dist(1)).text""",
     "SamplingError", "removed every candidate"),
    ("-inf bias, then greedy", """
        bias = {t: float("-inf") for t in range(llama.model.n_vocab)}
        return llama.create_completion('Hi', 4, sampler=lp.SamplerChain().logit_bias(bias).greedy()).text""",
     "SamplingError", "removed every candidate"),
    ("samplers that remove every candidate", """
        bias = {t: float("-inf") for t in range(llama.model.n_vocab)}
        chain = lp.SamplerChain().logit_bias(bias).top_k(5).top_p(0.9, 1).min_p(0.05, 1).temp(0.8)
        return llama.create_completion('Hi', 4, sampler=chain).text""", "SamplingError", "removed every candidate"),
    ("raw handle of a context with no logits", """
        llama.context.clear_cache()
        return lp.SamplerChain().temp(0.8).sample(llama.context.raw_handle(), 3)""",
     "InvalidParameterError", "no logits"),
    ("logit bias on a token outside the vocabulary", """
        return llama.create_completion('Hi', 4, sampler=lp.SamplerChain().logit_bias({10**6: 1.0}).greedy()).text""",
     "InvalidTokenError", "outside the vocabulary"),
])
def test_what_would_abort_is_a_llama_error(label, code, error, fragment):
    body = "def case():\n" + textwrap.indent(textwrap.dedent(code).strip(), "    ") + "\n"
    out = child("llama = load()\n" + body + "out = outcome(case)\n")
    assert out.get("error") == error, f"{label}: {out}"
    assert fragment in out["message"], f"{label}: {out['message']}"


def test_a_chain_cannot_grow_after_its_appended_dist_sampled():
    out = child("""
        llama = load()
        chain = seed001_chain()
        llama.create_completion("Hi", 2, sampler=chain)
        out = outcome(lambda: chain.top_k(3) and None)
        out["names"] = chain.names
    """)
    assert out["error"] == "InvalidParameterError" and "build a new chain" in out["message"]
    assert out["names"] == ["temp", "top_p", "min_p", "penalties"]
