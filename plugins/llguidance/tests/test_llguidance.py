"""The llguidance sampler plugin on SmolLM2: registered through the sampler hook as a third party's, JSON schemas
llama.cpp's GBNF converter takes loosely (a pattern it cannot express, a format it does not check) enforced, an
unsupported keyword refused by name, Lark grammars; a chain's constraint sampled as a grammar is (its pick
checked alone, the whole mask only after a refusal)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest

import llamaplug as lp
from llamaplug.plugins import sampler_factories

# \d is an escape llama.cpp's converter does not know (it accepts any string for the pattern, with a
# warning), and it checks no "email" format.
SCHEMA = {"type": "object", "properties": {
    "code": {"type": "string", "pattern": r"^[A-Z]{2}-\d{3}$"},
    "contact": {"type": "string", "format": "email", "maxLength": 30}},
    "required": ["code", "contact"], "additionalProperties": False}
PROMPT = "A product record as JSON, with its code and a contact email address:\n"


def _chain(llama: lp.Llama, **constraint) -> lp.SamplerChain:
    return lp.SamplerChain().add("llguidance", model=llama.model, **constraint).greedy()


def test_registered_through_the_sampler_hook() -> None:
    from llamaplug_llguidance import llguidance

    found = sampler_factories()["llguidance"]
    assert found.factory is llguidance and found.distribution == "llamaplug-llguidance"


def test_a_schema_the_gbnf_converter_takes_loosely_is_enforced(llama, caplog) -> None:
    with caplog.at_level("WARNING", logger="llamaplug.json_schema"):
        lp.Grammar.from_json_schema(SCHEMA)
    assert "is not supported" in caplog.text  # the converter's own word: this pattern matches any string there
    out = llama.create_completion(PROMPT, sampler=_chain(llama, json_schema=SCHEMA), max_tokens=80)
    print(f"llguidance: {out.text!r} ({out.stop_reason})")
    value = json.loads(out.text)
    jsonschema.validate(value, SCHEMA, format_checker=jsonschema.FormatChecker())


def test_an_unsupported_keyword_is_named(llama) -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(lp.InvalidParameterError, match="uniqueItems") as err:
        _chain(llama, json_schema=schema)
    assert err.value.field == "json_schema"
    with pytest.raises(lp.InvalidParameterError, match="exactly one"):
        _chain(llama, json_schema=schema, lark='start: "a"')


def test_a_lark_grammar_and_gbnf(llama) -> None:
    out = llama.create_completion("Is the sky blue? Answer:", sampler=_chain(llama, lark='start: " yes" | " no"'),
                                  max_tokens=8)
    assert out.text in (" yes", " no")
    out = llama.create_completion("Count: ", sampler=_chain(llama, grammar='root ::= [0-9] " " [0-9]'), max_tokens=8)
    assert len(out.text) == 3 and out.text[0].isdigit() and out.text[2].isdigit()


class _Counting:
    """The llguidance sampler, counting its applies on one candidate (the chain's pick checked) and on more
    (the whole mask), and the checks it refused."""

    def __init__(self, inner):
        self.inner, self.checks, self.refused, self.masks = inner, 0, 0, 0

    def apply(self, candidates) -> None:
        self.inner.apply(candidates)
        if len(candidates) == 1:
            self.checks += 1
            self.refused += int(candidates.logits[0] == float("-inf"))
        else:
            self.masks += 1

    def accept(self, token: int) -> None:
        self.inner.accept(token)

    def reset(self) -> None:
        self.inner.reset()


def test_a_constrained_chain_masks_the_vocabulary_only_for_a_refused_pick(llama) -> None:
    # Sampled the way a GBNF grammar is (llamaplug_sample_grammar_checked): the pick checked alone, the whole mask
    # only to sample again after a refusal; before, every token filled llguidance's mask over the vocabulary.
    from llamaplug_llguidance.sampler import make_sampler

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
              "required": ["ok", "n"], "additionalProperties": False}
    counting = _Counting(make_sampler(llama.model, json_schema=schema))
    chain = lp.SamplerChain(seed=7).top_k(40).temp(0.8).dist().constrained(
        lp.LlamaSampler.from_python(counting, "llguidance"))
    out = llama.create_completion('A JSON status, {"ok": ...}:\n', sampler=chain, max_tokens=32)
    jsonschema.validate(json.loads(out.text), schema)
    tokens = len(llama.tokenize(out.text, False, False))
    assert counting.checks >= tokens and counting.masks == counting.refused < counting.checks, vars(counting)
    bad = llama.tokenize("}", False, False)[0]
    chain.reset()
    with pytest.raises(lp.SamplingError, match=f"does not allow token {bad}"):
        chain.accept(bad)  # a token given, not sampled, goes through the constraint too


def test_one_candidate_is_judged_as_the_whole_mask_judges_it(llama) -> None:
    # The one-candidate path (validate_tokens, is_accepting for an end token) against the mask, token by token,
    # before " yes", after it (accepting, stopped: end tokens only), for a grammar that may go on ("a"+).
    from llamaplug_llguidance.sampler import make_sampler

    def judged(sampler, ids, one_by_one):
        if not one_by_one:
            cands = SimpleNamespace(ids=np.array(ids, dtype=np.int32), logits=np.zeros(len(ids), dtype=np.float32))
            sampler.apply(cands)
            return list(cands.logits > -np.inf)
        return [judged(sampler, [t], False)[0] for t in ids]

    model = llama.model
    ends = [t for t in range(model.n_vocab) if model.token_is_eog(t)]
    for lark, text in (('start: " yes" | " no"', " yes"), ('start: "a"+', "aa")):
        sampler = make_sampler(model, lark=lark)
        probe = ends + model.tokenize(text + " no a", False, False) + list(range(0, model.n_vocab, 997))
        for step in range(2):
            allowed = judged(sampler, probe, False)
            assert judged(sampler, probe, True) == allowed and any(allowed), (lark, step)
            assert [allowed[i] for i in range(len(ends))] == [step == 1] * len(ends), (lark, step)
            if step == 0:
                for token in model.tokenize(text, False, False):
                    sampler.accept(token)
