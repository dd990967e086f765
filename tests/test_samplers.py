"""Every sampler of the pinned llama.h, each shown changing the real model's distribution as its definition says.

`after(sampler_chain, logits)` runs only the chain's first sampler (llama_sampler_apply) over
candidates made from SmolLM2's real logits and returns what is left, so each test reads the
sampler's effect directly; generation tests show the same through create_completion.
"""

from __future__ import annotations

import numpy as np
import pytest

import llamaplug as lp
from llamaplug.raw import ffi, lib

PROMPT = "The capital of France is"
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


@pytest.fixture(scope="module")
def logits(llama) -> np.ndarray:
    ctx = llama.context
    ctx.clear_cache()
    ctx.eval(llama.model.tokenize(PROMPT), 0)
    return ctx.get_logits_ith(-1).copy()


def after(llama, chain: lp.SamplerChain, logits: np.ndarray, accepted: tuple[int, ...] = ()) -> np.ndarray:
    """The candidates left after the chain's first sampler (`accepted` fed to it first)."""
    chain._build(llama.model.n_vocab, llama.model._vocab_ptr)
    first = lib.llama_sampler_chain_get(chain._ptr, 0)
    for token in accepted:
        lib.llama_sampler_accept(first, token)
    n = logits.size
    data = ffi.new("llama_token_data[]", n)
    view = np.frombuffer(ffi.buffer(data), dtype=TOKEN_DATA)
    view["id"] = np.arange(n)
    view["logit"] = logits
    view["p"] = 0
    cur = ffi.new("llama_token_data_array *", {"data": data, "size": n, "selected": -1, "sorted": False})
    lib.llama_sampler_apply(first, cur)
    return np.frombuffer(ffi.buffer(cur.data, cur.size * TOKEN_DATA.itemsize), dtype=TOKEN_DATA).copy()


def probs(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(), dtype=np.float64)
    return e / e.sum()


def test_top_k_1_is_greedy(llama):
    greedy = llama.create_completion(PROMPT, 16).tokens
    assert llama.create_completion(PROMPT, 16, sampler=lp.SamplerChain().top_k(1).dist(5)).tokens == greedy


def test_same_seed_same_text_other_seed_other_text(llama):
    def run(seed):
        return llama.create_completion(PROMPT, 32, sampler=lp.SamplerChain(seed=seed).top_k(40).temp(1.0)).tokens

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_top_k_keeps_the_k_largest(llama, logits):
    left = after(llama, lp.SamplerChain().top_k(5), logits)
    assert sorted(left["id"]) == sorted(np.argsort(-logits)[:5])


def test_min_p_prunes_below_p_times_the_top_probability(llama, logits):
    p = probs(logits)
    left = after(llama, lp.SamplerChain().min_p(0.1, 1), logits)
    assert set(left["id"]) == set(np.flatnonzero(p >= 0.1 * p.max()))


def test_top_p_keeps_the_smallest_set_reaching_p(llama, logits):
    p = probs(logits)
    order = np.argsort(-p)
    need = int(np.searchsorted(np.cumsum(p[order]), 0.9) + 1)
    left = after(llama, lp.SamplerChain().top_p(0.9, 1), logits)
    assert set(left["id"]) == set(order[:need])


def test_temp_and_temp_ext_without_range_divide_the_logits(llama, logits):
    for chain in (lp.SamplerChain().temp(0.5), lp.SamplerChain().temp_ext(0.5, 0.0, 1.0)):
        left = after(llama, chain, logits)
        np.testing.assert_allclose(left["logit"], logits[left["id"]] / 0.5, rtol=1e-5)


def test_top_n_sigma_keeps_logits_within_n_deviations_of_the_top(llama, logits):
    left = after(llama, lp.SamplerChain().top_n_sigma(1.0), logits)
    kept = set(left["id"][np.isfinite(left["logit"])])
    assert kept == set(np.flatnonzero(logits >= logits.max() - 1.0 * logits.std()))


def test_xtc_at_probability_1_removes_the_top_choices(llama, logits):
    threshold = 0.01
    p = probs(logits)
    above = np.flatnonzero(p >= threshold)
    assert above.size >= 2  # the definition needs two tokens above the threshold
    left = after(llama, lp.SamplerChain().xtc(1.0, threshold, 1, 7), logits)
    kept_above = set(left["id"]) & set(above)
    assert kept_above == {above[np.argmin(p[above])]}  # of those above t, only the least likely stays


def test_penalties_lower_a_repeated_token(llama, logits):
    top = int(np.argmax(logits))
    left = after(llama, lp.SamplerChain().penalties(64, 1.5, 0.0, 0.0), logits, accepted=(top,))
    by_id = dict(zip(left["id"].tolist(), left["logit"].tolist()))
    expected = logits[top] / 1.5 if logits[top] > 0 else logits[top] * 1.5
    assert by_id[top] == pytest.approx(expected, rel=1e-5)
    other = int(np.argsort(-logits)[1])
    assert by_id[other] == pytest.approx(float(logits[other]))


def test_dry_penalises_the_token_that_extends_a_repetition(llama, logits):
    seq = llama.model.tokenize(" one two three four one two three", add_bos=False)
    nxt = llama.model.tokenize(" four", add_bos=False)[0]
    left = after(llama, lp.SamplerChain().dry(0.8, 1.75, 2, 64), logits, accepted=tuple(seq))
    by_id = dict(zip(left["id"].tolist(), left["logit"].tolist()))
    assert by_id[nxt] < logits[nxt] - 0.5  # the repeated continuation is penalised
    other = int(np.argmax(logits))
    assert by_id[other] == pytest.approx(float(logits[other]))  # tokens that repeat nothing are not


def test_logit_bias_minus_inf_bans_a_token(llama):
    greedy = llama.create_completion(PROMPT, 4).tokens
    chain = lp.SamplerChain().logit_bias({greedy[0]: float("-inf")}).greedy()
    out = llama.create_completion(PROMPT, 4, sampler=chain).tokens
    assert out[0] != greedy[0]


def test_typical_keeps_tokens_near_the_expected_surprise(llama, logits):
    # The definition: sort by |surprise - entropy|, keep the fewest whose probabilities pass p.
    p = probs(logits)
    entropy = -(p * np.log(p + 1e-30)).sum()
    order = np.argsort(np.abs(-np.log(p + 1e-30) - entropy), kind="stable")
    need = int(np.flatnonzero(np.cumsum(p[order]) > 0.5)[0]) + 1
    left = after(llama, lp.SamplerChain().typical(0.5, 1), logits)
    assert set(left["id"]) == set(order[:need].tolist())


@pytest.mark.parametrize("chain", [
    lambda: lp.SamplerChain().mirostat(0.01, 0.1, 100, 3),
    lambda: lp.SamplerChain().mirostat_v2(0.01, 0.1, 3),
], ids=["mirostat", "mirostat_v2"])
def test_mirostat_with_a_tiny_target_surprise_picks_the_most_likely(llama, chain):
    # tau near 0 asks for no surprise: only the most likely token fits its mu.
    greedy = llama.create_completion(PROMPT, 1).tokens
    assert llama.create_completion(PROMPT, 1, sampler=chain()).tokens == greedy


def test_mirostat_with_a_high_target_surprise_strays_from_greedy(llama):
    greedy = llama.create_completion(PROMPT, 24).tokens
    assert llama.create_completion(PROMPT, 24, sampler=lp.SamplerChain().mirostat_v2(12.0, 0.1, 3)).tokens != greedy


def test_adaptive_p_selects(llama):
    chain = lp.SamplerChain(seed=2).min_p(0.05).adaptive_p(0.3, 0.9)
    out = llama.create_completion(PROMPT, 8, sampler=chain)
    assert out.tokens and "dist" not in chain._describe()


def test_infill_keeps_only_end_tokens_when_they_weigh_enough(llama, logits):
    # Its rule: when 3 * p(EOG) * n > p(text), only the end-of-generation tokens stay, renormalised.
    eog = np.array([llama.model.token_is_eog(t) for t in range(logits.size)])
    raised = logits.copy()
    raised[eog] = logits.max()  # the model's real logits, with the end tokens made as likely as its best
    p = probs(raised)
    assert 3 * p[eog].sum() * logits.size > p[~eog].sum()  # the case the rule is about
    left = after(llama, lp.SamplerChain().infill(), raised)
    assert set(left["id"].tolist()) == set(np.flatnonzero(eog).tolist())
    assert left["p"].sum() == pytest.approx(1.0, rel=1e-5)


def test_grammar_constrains_the_text(llama):
    chain = lp.SamplerChain(seed=4).grammar('root ::= ("yes" | "no") "." ').temp(1.5)
    for _ in range(3):
        text = llama.create_completion("Is Paris in France? Answer:", 8, sampler=chain).text
        assert text in ("yes.", "no."), text
        chain = lp.SamplerChain(seed=4).grammar('root ::= ("yes" | "no") "."').temp(1.5)


def test_grammar_from_file_and_its_errors(tmp_path):
    path = tmp_path / "g.gbnf"
    path.write_text('root ::= item+\nitem ::= [0-9] ","\n')
    assert lp.Grammar.from_file(path).root == "root"
    path.write_text('root ::= "a"\nitem ::= [0-9] | @\n')
    with pytest.raises(lp.InvalidGrammarError) as err:
        lp.Grammar.from_file(path)
    assert (err.value.line, err.value.column) == (2, 18) and "expecting newline or end" in err.value.reason
    assert str(path) in str(err.value)
    # the grammar ends where the parser wants more: it points at the end (its "at <rest>" has no rest), and
    # line and column say so (they were None: README's example, issue 48's walk-through)
    with pytest.raises(lp.InvalidGrammarError) as err:
        lp.Grammar.from_string('root ::= "a"\nitem ::= ("yes" | \n')
    assert (err.value.line, err.value.column) == (2, 18), err.value
    assert err.value.reason == "expecting ')' at the end of the grammar"
    with pytest.raises(lp.InvalidGrammarError, match="does not contain a 'start' symbol"):
        lp.Grammar.from_string('root ::= "a"', root="start")
    with pytest.raises(lp.InvalidGrammarError, match="Undefined rule identifier 'missing'"):
        lp.SamplerChain().grammar('root ::= missing')
    # llama.cpp names an undefined rule but not where: its first use (not in a literal, a class or a comment)
    with pytest.raises(lp.InvalidGrammarError) as err:
        lp.Grammar.from_string('root ::= "missing" [missing] item # missing\nitem ::= "a" missing\n')
    assert (err.value.line, err.value.column) == (2, 14), err.value


def test_a_grammar_chain_accepts_only_its_own_samples(llama):
    chain = lp.SamplerChain().grammar('root ::= "yes"').greedy()
    llama.context.clear_cache()
    llama.context.eval(llama.model.tokenize("Answer:"), 0)
    token = chain.sample(llama.context)
    chain.accept(token)  # the sampled one: fine
    with pytest.raises(lp.InvalidParameterError, match="accepts only its own samples"):
        chain.accept(llama.model.tokenize(" no", add_bos=False)[0])


@pytest.fixture
def native_calls(monkeypatch) -> list[lp.LlamaSampler]:
    """The samplers whose native sample (llama_sampler_sample) runs during the test, in order."""
    calls: list[lp.LlamaSampler] = []
    sample_native = lp.LlamaSampler._sample_native
    monkeypatch.setattr(lp.LlamaSampler, "_sample_native",
                        lambda self, *a: calls.append(self) or sample_native(self, *a))
    return calls


def test_greedy_after_samplers_that_keep_the_top_token_picks_as_the_native_chain(llama, native_calls):
    """Temperature 0 with llama-server's samplers (all at options that keep the most likely token):
    argmax over the logits view, never the native chain, and the same token as the native chain
    (reached through the raw handle) at every step of a generation."""
    ctx, model = llama.context, llama.model
    fast, native = (lp.SamplerParams(temperature=0, seed=1).build_chain(model) for _ in range(2))
    ctx.clear_cache()
    tokens = model.tokenize(PROMPT)
    ctx.eval(tokens, 0)
    for _ in range(24):
        token = fast.sample(ctx, -1)
        assert native_calls == []
        assert native.sample(ctx.raw_handle(), -1) == token
        native_calls.clear()
        ctx.eval([token], len(tokens))
        tokens.append(token)


@pytest.mark.parametrize("options", [{"xtc_probability": 1.0, "xtc_threshold": 0.01}, {"typical_p": 0.2},
                                     {"penalty_repeat": 5.0}, {"logit_bias": {0: 1.0}}])
def test_greedy_after_a_sampler_that_can_move_the_top_token_runs_the_native_chain(llama, logits, native_calls,
                                                                                 options):
    chain = lp.SamplerParams(temperature=0, seed=1, **options).build_chain(llama.model)
    ctx = llama.context
    ctx.clear_cache()
    ctx.eval(llama.model.tokenize(PROMPT), 0)
    chain.accept(int(np.argmax(logits)))  # what the repetition penalty then lowers
    token = chain.sample(ctx, -1)
    assert native_calls == [chain]
    if "xtc_probability" in options or "penalty_repeat" in options:
        assert token != int(np.argmax(logits))  # these options do move it here: the native chain had to run


def test_sampler_params_build_llama_cpps_common_chain(llama):
    chain = lp.SamplerParams(seed=1).build_chain(llama.model)
    assert chain.names == ["penalties", "dry", "top_n_sigma", "top_k", "typical", "top_p", "min_p", "xtc",
                           "temp_ext", "dist"]
    assert lp.SamplerChain.from_params(lp.SamplerParams(mirostat=2)).names == ["temp", "mirostat_v2"]
    assert lp.SamplerChain.from_params(lp.SamplerParams(temperature=0)).names[-1] == "greedy"
    grammar_first = lp.SamplerChain.from_params(lp.SamplerParams(grammar='root ::= "x"', logit_bias={1: -1.0}))
    assert grammar_first.names[:2] == ["grammar", "logit_bias"]
    with pytest.raises(lp.InvalidParameterError) as err:
        lp.SamplerParams(samplers=["top_k", "nucleus"])
    assert err.value.field.startswith("samplers")
