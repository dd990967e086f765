"""The llguidance sampler plugin on SmolLM2: registered through the sampler hook as a third party's, JSON schemas
llama.cpp's GBNF converter takes loosely (a pattern it cannot express, a format it does not check) enforced, an
unsupported keyword refused by name, Lark grammars."""

from __future__ import annotations

import json

import jsonschema
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
