"""The schemas the GBNF engine refuses for their size, under llguidance (issue 42 part 4).

bench/structured_corpus.py's size_refused_schemas: one schema past each of the GBNF engine's size bounds
(blocks/json_schema.py's depth, values and optional properties; blocks/grammar_bounds.py's bytes, rules,
alternatives, chain and repetition on the converted grammar). Each is refused by the GBNF engine. llguidance
compiles and samples all but two, and SmolLM2's replies under it through the chat API (greedy and two seeds, 256
tokens) that finish are JSON the schema validates (jsonschema, formats checked); a reply cut at max_tokens is a
prefix llguidance allowed (the greedy reply to 600 optional properties names them in order: p1, p2, ... and needs
some 3,700 tokens). The two refused, by name: 24,000 properties, past llguidance's own bound on a schema's size
(50,000 compiled subschemas, not configurable in 1.9.1), and a pattern of 100,001 optional groups, past the
plugin's bound on a pattern's length (sampler.MAX_PATTERN: llguidance 1.9.1 spends 100 s on its first token and then
panics).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from llamaplug_llguidance.sampler import MAX_DEPTH, MAX_PATTERN, schema_depth

import llamaplug as lp
from llamaplug.high.structured import constraint

BENCH = Path(__file__).resolve().parents[3] / "bench" / "structured_corpus.py"
ASK = [{"role": "user", "content": "Reply with a short JSON value."}]
# what llguidance refuses, and the words that name why
REFUSED_BY_LLGUIDANCE = {"grammar-bytes-24000-properties": "schema too large",
                         "pattern-rules-100001": f"longer than {MAX_PATTERN} characters"}
# room for a reply to finish: grammar-bytes' keys are 420 characters long
MAX_TOKENS = {"grammar-bytes": 1024}


def _schemas() -> dict[str, dict]:
    spec = importlib.util.spec_from_file_location("structured_corpus", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.size_refused_schemas()


SCHEMAS = _schemas()


def _errors(schema: dict, text: str) -> list[str]:
    """What jsonschema finds wrong with the JSON `text` (formats checked). Its validator recurses a few Python frames
    a level: 250 nested arrays need more than Python's default 1,000."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
        return [e.message[:200] for e in validator.iter_errors(json.loads(text))]
    finally:
        sys.setrecursionlimit(limit)


def _form(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_refused_by_gbnf_for_its_size(llama, name) -> None:
    with pytest.raises(lp.LlamaError, match=r"at most|more than|deeper than"):
        constraint(llama.model, "gbnf", json_schema=SCHEMAS[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(SCHEMAS) - set(REFUSED_BY_LLGUIDANCE)))
def test_llguidance_compiles_it_and_its_replies_validate(llama, name) -> None:
    schema = SCHEMAS[name]
    samplers = [None] + [lp.SamplerChain(seed=seed).top_k(40).temp(0.7) for seed in (1000, 1001)]
    finished = 0
    for sampler in samplers:
        out = llama.create_chat_completion(ASK, response_format=_form(schema), structured_engine="llguidance",
                                           sampler=sampler, max_tokens=MAX_TOKENS.get(name, 256))
        choice = out.choices[0]
        text = choice.message.content
        print(f"{name} {'greedy' if sampler is None else 'seeded'}: {text[:120]!r} ({choice.finish_reason})")
        if choice.finish_reason == "length":
            continue
        assert choice.finish_reason == "stop", (name, text[-200:])
        finished += 1
        errors = _errors(schema, text)
        assert not errors, (name, text[:300], errors)
    assert finished, f"{name}: no reply of three finished within {MAX_TOKENS.get(name, 256)} tokens"


@pytest.mark.parametrize("name", sorted(REFUSED_BY_LLGUIDANCE))
def test_what_llguidance_refuses_is_refused_by_name(llama, name) -> None:
    with pytest.raises(lp.InvalidParameterError, match=REFUSED_BY_LLGUIDANCE[name]) as err:
        constraint(llama.model, "llguidance", json_schema=SCHEMAS[name])
    assert err.value.field == "json_schema"


def test_nesting_past_the_json_readers_128_levels_compiles(llama) -> None:
    """250 nested arrays: llguidance's JSON text reader stops at 128 levels ("recursion limit exceeded"), which
    the plugin passes by giving llguidance the schema as a dict."""
    schema = SCHEMAS["nested-arrays-250"]
    assert 128 < schema_depth(schema) <= MAX_DEPTH
    constraint(llama.model, "llguidance", json_schema=schema).close()


def test_the_depth_follows_local_refs() -> None:
    assert schema_depth(SCHEMAS["ref-chain-5000"]) > 5000  # 5,000 levels through its $refs, its JSON 3 deep
    tree = {"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}}, "$ref": "#/$defs/t"}
    assert schema_depth(tree) == 4  # recursion: the rule made once
    assert schema_depth({"type": "integer"}) == 1 and schema_depth(True) == 0


def test_deep_schemas_compile_on_the_compile_threads_stack_and_past_the_bound_are_refused(smollm2_path) -> None:
    """A chain of 5,000 $defs (each an object whose property refers to the next: 15,000 levels) overflows an 8 MiB
    stack inside llguidance 1.9.1's compiler (920 do); on the plugin's compile thread it compiles. A chain of $refs
    past MAX_DEPTH is refused by name. A fresh process: an overflow would kill this one."""
    code = f"""
import llamaplug as lp
from llamaplug.high.structured import constraint
defs = {{f"d{{i}}": {{"type": "object", "properties": {{"a": {{"$ref": f"#/$defs/d{{i + 1}}"}}}}}}
        for i in range(5000)}}
defs["d5000"] = {{"type": "integer"}}
refs = {{f"d{{i}}": {{"$ref": f"#/$defs/d{{i + 1}}"}} for i in range({MAX_DEPTH})}}
refs["d{MAX_DEPTH}"] = {{"type": "integer"}}
with lp.Llama.load(lp.LlamaParams(model_path={str(smollm2_path)!r}, n_ctx=256, n_threads=1)) as llama:
    constraint(llama.model, "llguidance", json_schema={{"$defs": defs, "$ref": "#/$defs/d0"}}).close()
    print("COMPILED")
    try:
        constraint(llama.model, "llguidance", json_schema={{"$defs": refs, "$ref": "#/$defs/d0"}}).close()
    except lp.InvalidParameterError as exc:
        print("REFUSED", exc)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "COMPILED" in done.stdout, done.stdout
    assert f"REFUSED the json_schema nests deeper than {MAX_DEPTH} levels" in done.stdout, done.stdout


def test_the_server_answers_400_past_a_bound_and_samples_a_deep_chain(smollm2_path) -> None:
    from llamaplug_testing.servers import llamaplug_server, post_status

    with llamaplug_server(smollm2_path, "-np", "1", "-c", "1024") as (port, _):
        body = {"messages": ASK, "max_tokens": 256, "structured_engine": "llguidance", "temperature": 0}
        status, answer = post_status(port, "/v1/chat/completions",
                                     {**body, "response_format": _form(SCHEMAS["pattern-rules-100001"])})
        assert status == 400, answer
        assert f"longer than {MAX_PATTERN} characters" in json.dumps(answer), answer
        for name in ("ref-chain-5000", "nested-arrays-250"):
            schema = SCHEMAS[name]
            status, answer = post_status(port, "/v1/chat/completions", {**body, "response_format": _form(schema)})
            assert status == 200 and answer["choices"][0]["finish_reason"] == "stop", answer
            content = answer["choices"][0]["message"]["content"]
            print(f"{name} over HTTP: {content[:80]!r}...")
            assert not _errors(schema, content), content
