"""JSON Schema -> GBNF: llama.cpp's own converter (through the core's shim), checked against the same converter
as the pin's tools build it (the reference program) and against `jsonschema`.

The judge of "does this grammar accept this text" is llama.cpp's grammar engine
itself (a grammar sampler fed the text's tokens one by one, then asked whether
end-of-generation may follow), not code of ours. The reference converter is the
pin's common/json-schema-to-grammar.cpp (native_tools.json_schema_reference()).
"""

from __future__ import annotations

import json
import random
import subprocess

import jsonschema
import pytest
from json_schemas import SCHEMAS, layouts, near_misses, sample

import llamaplug as lp
from llamaplug.blocks.json_schema import UnsupportedSchemaError, schema_to_gbnf
from llamaplug.raw import ffi, lib


class Matcher:
    """Whether a GBNF grammar accepts a whole text, by llama.cpp's grammar engine."""

    def __init__(self, model: lp.LlamaModel, gbnf: str):
        self.model = model
        self.vocab = model._vocab_ptr
        self.ptr = lp.Grammar(gbnf).sampler_ptr(self.vocab)
        self.cand = ffi.new("llama_token_data[1]")
        self.cur = ffi.new("llama_token_data_array *")

    def allows(self, token: int) -> bool:
        self.cand[0].id, self.cand[0].logit, self.cand[0].p = token, 0.0, 0.0
        self.cur.data, self.cur.size, self.cur.selected, self.cur.sorted = self.cand, 1, -1, False
        lib.llama_sampler_apply(self.ptr, self.cur)
        return self.cand[0].logit != float("-inf")

    def accepts(self, text: str) -> bool:
        lib.llama_sampler_reset(self.ptr)
        for token in self.model.tokenize(text, add_bos=False):
            if not self.allows(token):
                return False
            lib.llama_sampler_accept(self.ptr, token)
        return self.allows(self.model.eos)

    def close(self) -> None:
        lib.llama_sampler_free(self.ptr)


@pytest.fixture(scope="module")
def reference_run(native_tools):
    """(refused, grammar) of llama.cpp's converter, the pin's common/ as the tools build it."""
    import native_tools as tools

    path = tools.json_schema_reference()

    def convert(schema: dict) -> tuple[bool, str]:
        done = subprocess.run([str(path)], input=json.dumps(schema), capture_output=True, text=True, timeout=60)
        return done.returncode != 0, done.stdout

    return convert


@pytest.fixture(scope="module")
def reference(native_tools):
    import native_tools as tools

    path = tools.json_schema_reference()

    def convert(schema: dict) -> str:
        done = subprocess.run([str(path)], input=json.dumps(schema), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    return convert


def texts_for(schema: dict, seed: int) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(6):
        value = sample(schema, rng, schema)
        out += layouts(value, rng) + near_misses(value, schema, rng)
    return list(dict.fromkeys(out))


@pytest.mark.parametrize("index", range(len(SCHEMAS)), ids=[json.dumps(s)[:40] for s in SCHEMAS])
def test_same_texts_as_llama_cpps_converter_and_only_valid_ones(llama, reference, index):
    schema = SCHEMAS[index]
    ours, theirs = Matcher(llama.model, schema_to_gbnf(schema)), Matcher(llama.model, reference(schema))
    try:
        verdicts = [(text, ours.accepts(text), theirs.accepts(text)) for text in texts_for(schema, index)]
    finally:
        ours.close()
        theirs.close()
    differ = [(t, a, b) for t, a, b in verdicts if a != b]
    assert not differ, f"ours vs llama.cpp's disagree on {differ[:5]}"
    accepted = [t for t, a, _ in verdicts if a]
    assert accepted and len(accepted) < len(verdicts)  # the set has texts on both sides
    for text in accepted:
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("schema", [
    {"type": "string", "format": "email"},
    {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    {"type": "object", "minProperties": 1},
    {"type": "string", "pattern": "^(?=a)b$"},
    {"not": {"type": "string"}},
    {"$ref": "https://example.com/s.json"},
    {"$ref": "#/$defs/missing"},
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
    {"type": "integer", "minimum": 5, "maximum": 2},
], ids=lambda s: json.dumps(s)[:40])
def test_the_same_schemas_are_refused_as_by_llama_cpps_converter(reference_run, schema):
    """What llama-server refuses is an UnsupportedSchemaError here; what it takes (loosely, as it does) is taken."""
    refused, theirs = reference_run(schema)
    if refused:
        with pytest.raises(UnsupportedSchemaError) as err:
            schema_to_gbnf(schema)
        assert err.value.field == "schema" and "llama.cpp" in str(err.value)
    else:
        assert schema_to_gbnf(schema) == theirs


def test_integer_ranges_exactly(llama):
    """Every integer from -1100 to 1100 against a few ranges, by llama.cpp's engine."""
    ranges = [(-5, 5), (0, 0), (7, 1003), (-1000, -99), (None, -10), (37, None)]
    for lo, hi in ranges:
        schema = {"type": "integer", **({"minimum": lo} if lo is not None else {}),
                  **({"maximum": hi} if hi is not None else {})}
        m = Matcher(llama.model, schema_to_gbnf(schema))
        try:
            for n in list(range(-1100, 1101, 7)) + [lo or 0, hi or 0, (lo or 0) - 1, (hi or 0) + 1]:
                inside = (lo is None or n >= lo) and (hi is None or n <= hi)
                assert m.accepts(str(n)) == inside, (schema, n)
            assert not m.accepts("007") and not m.accepts("1.0")  # ("-0" is JSON for 0: llama.cpp takes it)
        finally:
            m.close()


@pytest.mark.parametrize("response_format", [
    {"type": "json_object"},
    {"type": "json_object", "schema": SCHEMAS[26]},
    {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMAS[26], "strict": True}},
])
def test_response_format_shapes(llama, response_format):
    chain = lp.SamplerChain(seed=5).top_k(40).temp(0.7)  # a seed whose free-form object ends (seed 0 nests on)
    out = llama.create_completion("A person as JSON:", 300, sampler=chain, response_format=response_format)
    assert out.stop_reason == lp.StopReason.EOS, out.text
    jsonschema.validate(json.loads(out.text), response_format.get("schema")
                        or response_format.get("json_schema", {}).get("schema") or {"type": "object"})


def test_bad_response_formats(llama):
    for bad, field in [({"type": "xml"}, "response_format.type"), ({"schema": {}}, "response_format"),
                       ({"type": "json_schema"}, "response_format.json_schema")]:
        with pytest.raises(lp.InvalidParameterError) as err:
            llama.create_completion("x", 2, response_format=bad)
        assert err.value.field == field


@pytest.mark.parametrize("index", range(len(SCHEMAS)), ids=[json.dumps(s)[:40] for s in SCHEMAS])
def test_generated_json_is_valid(llama, index):
    """The real model under each schema's grammar: sampled generations here, 100 each in bench/json_schema.py.

    Every finished text is valid; a text cut at max_tokens (a model that keeps adding
    keys or nesting, as a schema may allow) is not a finished output and is not judged.
    """
    schema = SCHEMAS[index]
    finished = 0
    for seed in range(10):
        chain = lp.SamplerChain(seed=seed).top_k(40).temp(1.0)
        out = llama.create_completion("JSON:", 200, sampler=chain, response_format={"type": "json_object",
                                                                                    "schema": schema})
        if out.stop_reason == lp.StopReason.EOS:
            jsonschema.validate(json.loads(out.text), schema)
            finished += 1
            if finished == 3:
                break
    assert finished >= 1
