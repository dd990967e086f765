#!/usr/bin/env python3
"""A corpus of JSON schemas through both structured engines (issue 42 part 4): compiles?, do the sampled outputs
validate, time to compile, time per token. A bench, not a timed test.

    .tox/py/bin/python bench/structured_corpus.py --threads 1 --n 3 --greedy --max-tokens 256 --sample-limit 10
    .tox/py/bin/python bench/structured_corpus.py --size-refused --threads 1 --n 3 --greedy --max-tokens 256
    .tox/py/bin/python bench/structured_corpus.py --limit 3 --max-tokens 8 --no-save   # a smoke run

The corpus (each schema tagged with its source):
- pin: the JSON schemas in the pinned llama.cpp's tests (tests/test-json-schema-to-grammar.cpp and
  tests/test-grammar-integration.cpp: every raw-string literal that parses as a JSON schema object);
- hypothesis: schemas drawn (derandomized, so the same every run) from a Hypothesis strategy of nested objects,
  arrays, anyOf, $ref/$defs, enums, integer and length bounds, patterns and formats;
- schemastore: real-world schemas from SchemaStore as the PyPI package check-jsonschema (0.39.0) vendors them
  (check_jsonschema/builtin_schemas/vendor/*.json: GitHub workflows, GitLab CI, Renovate, compose, ...);
  skipped with a note when it is not installed (`pip install check-jsonschema==0.39.0`, or --schemastore DIR).
`--size-refused` runs instead the schemas past each of the GBNF engine's size bounds (size_refused_schemas).

Engines: "gbnf" (blocks/json_schema.py: llama.cpp's own converter, common/json-schema-to-grammar.cpp of the pin,
through the shim, behind our size bounds; the pin ships no json_schema_to_grammar.py script any more, so that
converter is llama.cpp's converter) and "llguidance" (the llamaplug-llguidance plugin's sampler). Where a schema
leaves them open, llguidance is given what llama.cpp's converter reads (--defaults llama.cpp, the default:
objects with properties closed, the converter's whitespace; see llama_cpp_reading), so that both constrain the
same outputs; --defaults json-schema gives it the schema as it is (open objects: the model may add keys).
For each schema and engine: compiled (the constraint built: GBNF converted and parsed by llama.cpp, or
llguidance's grammar and matcher) or the reason it was refused, the time that took, then `--n` samples
(top_k 40, temperature 0.7, fixed seeds, the same for both engines; and one greedy with --greedy) of at most
`--max-tokens`, sampled `--parallel` at a time in one engine's batches, the engines' batches alternating:
finished (not cut at max_tokens), valid (jsonschema against the schema as given, formats checked). Schemas
jsonschema itself rejects are left out. Time per token: each engine's batches' wall time over the tokens they
sampled (the model's decode of the batch included); bench/structured_speed.py measures one sequence's
constrained tokens/s against free generation.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ENGINES = ("gbnf", "llguidance")
KEYWORDS = {"type", "properties", "items", "$ref", "anyOf", "oneOf", "allOf", "enum", "const", "pattern", "format",
            "$defs", "definitions", "minimum", "maximum", "additionalProperties", "prefixItems", "minItems",
            "maxItems", "minLength", "maxLength", "required", "$schema", "not"}


def pin_schemas() -> list[dict[str, Any]]:
    """The JSON schema literals of the pin's converter and grammar-integration tests."""
    out = subprocess.run([sys.executable, str(ROOT / "vendor/llama.cpp/fetch.py")], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    found: list[dict[str, Any]] = []
    for name in ("test-json-schema-to-grammar.cpp", "test-grammar-integration.cpp"):
        text = (Path(out) / "tests" / name).read_text()
        for raw in re.findall(r'R"""\((.*?)\)"""', text, re.S):
            try:
                value = json.loads(raw)
            except ValueError:
                continue  # a grammar or a test string
            if isinstance(value, dict) and value and set(value) & KEYWORDS and not _is_instance_like(value):
                found.append(value)
    return found


def _is_instance_like(value: dict[str, Any]) -> bool:
    # the integration tests' passing/failing strings are JSON too: a schema's "type" is a name or a list of them
    t = value.get("type")
    return t is not None and not isinstance(t, (str, list))


def hypothesis_schemas(n: int) -> list[dict[str, Any]]:
    """`n` schemas from a Hypothesis strategy, derandomized: the same list every run."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    names = st.sampled_from(["id", "name", "age", "tags", "email", "when", "score", "kind", "note", "code"])
    leaf = st.one_of(
        st.just({"type": "boolean"}), st.just({"type": "null"}),
        st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
                  st.integers(-1000, 1000), st.integers(0, 10**6)),
        st.builds(lambda lo: {"type": "number", "minimum": lo}, st.integers(-100, 100)),
        st.builds(lambda a, b: {"type": "string", "minLength": a, "maxLength": a + b},
                  st.integers(0, 5), st.integers(0, 20)),
        st.sampled_from([{"type": "string", "pattern": "^[a-z]{2,5}$"},
                         {"type": "string", "pattern": r"^\d{3}-\d{4}$"},
                         {"type": "string", "format": "date"}, {"type": "string", "format": "email"},
                         {"type": "string", "format": "uuid"}, {"type": "string", "format": "date-time"}]),
        st.lists(st.sampled_from(["red", "green", "blue", 1, 2, None, True]), min_size=1, max_size=4,
                 unique_by=lambda v: json.dumps(v)).map(lambda v: {"enum": v}),
    )

    def extend(children: Any) -> Any:
        return st.one_of(
            st.builds(lambda props, mask, closed: {"type": "object", "properties": props,
                                                   "required": [k for k, m in zip(props, mask) if m],
                                                   "additionalProperties": not closed},
                      st.dictionaries(names, children, min_size=1, max_size=4),
                      st.lists(st.booleans(), min_size=4, max_size=4), st.booleans()),
            st.builds(lambda item, lo, span: {"type": "array", "items": item, "minItems": lo, "maxItems": lo + span},
                      children, st.integers(0, 2), st.integers(0, 4)),
            st.lists(children, min_size=2, max_size=3).map(lambda xs: {"anyOf": xs}),
        )

    nested = st.recursive(leaf, extend, max_leaves=8)
    # $ref/$defs at the root only: "#/$defs/item" inside a nested schema would point at the root's (none there)
    top = st.one_of(nested, nested.map(lambda inner: {"$defs": {"item": inner}, "type": "array",
                                                      "items": {"$ref": "#/$defs/item"}, "maxItems": 3}))

    drawn: list[dict[str, Any]] = []

    @settings(max_examples=n * 3, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(top)
    def draw(schema: dict[str, Any]) -> None:
        drawn.append(schema)

    draw()
    unique = list({json.dumps(s, sort_keys=True): s for s in drawn}.values())
    # the richest first: Hypothesis starts from the simplest examples
    unique.sort(key=lambda s: -len(json.dumps(s)))
    return unique[:n]


def schemastore_schemas(folder: str | None) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    if folder is None:
        spec = importlib.util.find_spec("check_jsonschema")
        if spec is None or not spec.submodule_search_locations:
            return [], "check-jsonschema is not installed: no SchemaStore schemas"
        folder = str(Path(next(iter(spec.submodule_search_locations))) / "builtin_schemas" / "vendor")
    paths = sorted(Path(folder).glob("*.json"))
    return [(p.stem, json.loads(p.read_text())) for p in paths], f"{len(paths)} schemas from {folder}"


def size_refused_schemas() -> dict[str, dict[str, Any]]:
    """One schema past each of the GBNF engine's size bounds (blocks/json_schema.py: depth, values, optional
    properties; blocks/grammar_bounds.py on the converted grammar: bytes, rules, alternatives, chain, repetition),
    each with short instances, so that llguidance's samples of them can finish."""
    def nested(depth: int, leaf: dict[str, Any]) -> dict[str, Any]:
        schema = leaf
        for _ in range(depth):
            schema = {"type": "array", "items": schema, "maxItems": 1}
        return schema

    chain: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(5000)}
    chain["d5000"] = {"type": "integer", "minimum": 0, "maximum": 9}
    return {
        # json_schema.py's bounds, checked on the schema before llama.cpp's converter sees it
        # objects closed, as the converter reads them anyway: open, llguidance lets the model add keys of its own
        "optional-600": {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(600)},
                         "additionalProperties": False},
        "nested-arrays-250": nested(250, {"type": "integer", "minimum": 0, "maximum": 9}),
        "values-100001": {"enum": list(range(100_001))},
        # grammar_bounds.py's, checked on the converter's grammar
        # (their nesting bound is out of a schema's reach: the converter loosens a pattern nested past 100 levels)
        "grammar-bytes": {"anyOf": [{"type": "object", "properties": {
            (hashlib.sha256(f"{i}_{j}".encode()).hexdigest() * 7)[:420]: {"type": "integer"} for j in range(300)},
            "additionalProperties": False} for i in range(5)]},
        # the bytes from 3,000 long keys sharing a prefix: llguidance compiles it but cannot sample its first key
        "grammar-bytes-shared-prefix": {"anyOf": [{"type": "object", "properties": {
            f"{'a_long_property_name_' * 10}{i}_{j}": {"type": "integer"} for j in range(300)},
            "additionalProperties": False} for i in range(10)]},
        # the bytes again, from more, smaller objects: past llguidance's own bound on a schema's size
        "grammar-bytes-24000-properties": {"anyOf": [{"type": "object", "properties": {
            f"k{i}_{j}": {"type": "integer"} for j in range(100)}, "additionalProperties": False} for i in range(240)]},
        "pattern-rules-100001": {"type": "string", "pattern": "^" + "(a)?" * 100_001 + "$"},
        "enum-5000": {"enum": [f"v{i}" for i in range(5000)]},
        "ref-chain-5000": {"$defs": chain, "$ref": "#/$defs/d0"},
        "max-length-1500000": {"type": "string", "maxLength": 1_500_000},
        "max-items-1500000": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                              "maxItems": 1_500_000},
    }


def corpus(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    import jsonschema

    notes: list[str] = []
    items = [{"source": "pin", "name": f"pin-{i}", "schema": s} for i, s in enumerate(pin_schemas())]
    items += [{"source": "hypothesis", "name": f"hyp-{i}", "schema": s}
              for i, s in enumerate(hypothesis_schemas(args.hypothesis))]
    store, note = schemastore_schemas(args.schemastore)
    notes.append(note)
    items += [{"source": "schemastore", "name": name, "schema": s} for name, s in store]
    kept = []
    for item in items:
        try:
            jsonschema.validators.validator_for(item["schema"]).check_schema(item["schema"])
        except jsonschema.SchemaError:
            continue  # a schema the pin's tests give as broken on purpose
        kept.append(item)
    notes.append(f"{len(items) - len(kept)} schemas left out that jsonschema itself rejects")
    unique = list({json.dumps(i["schema"], sort_keys=True): i for i in kept}.values())
    if args.limit:
        unique = unique[:args.limit]
    ranks: dict[str, int] = {}
    for item in unique:  # each schema's place among its source's, for --sample-limit
        item["rank"] = ranks[item["source"]] = ranks.get(item["source"], -1) + 1
    return unique, notes


# Keywords whose value is a schema, a list of schemas, or a map of names to schemas (for the walk below).
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
        "additionalItems", "unevaluatedItems", "unevaluatedProperties")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# llama.cpp's converter's whitespace between tokens (`space ::= | " " | "\n"{1,2} [ \t]{0,20}`) as a regex
# An object beside these is left open: llguidance intersects them with it, where the converter reads the
# properties alone, so closed it could exclude what they allow.
_COMBINED = {"allOf", "anyOf", "oneOf", "$ref"}
LLAMA_CPP_SPACE = r"(?: |\n{1,2}[ \t]{0,20})"


def llama_cpp_reading(schema: Any) -> Any:
    """`schema` for llguidance as llama.cpp's converter reads what a schema leaves open (--defaults llama.cpp): an
    object that lists `properties` and says nothing of `additionalProperties` closed (common/json-schema.cpp: only
    an object without properties takes any keys; JSON Schema's default is open, llguidance's too), but for the
    members of an `allOf` and what their `$ref`s point at (the converter merges those: closed apart they would
    exclude each other's properties) and for an object beside an `allOf`, `anyOf`, `oneOf` or `$ref`; an integer
    of at most 16 digits where its bounds leave it open (the converter's integral part); and between tokens the
    converter's whitespace (llguidance's x-guidance whitespace_pattern; its default takes any run of
    JSON whitespace). Every output of the closed schema is one of the schema's own, and samples are validated
    against the schema as given."""
    if not isinstance(schema, dict):
        return schema
    merged: set[str] = set()

    def members(node: Any) -> None:  # the $refs that are allOf members, wherever they are
        if isinstance(node, dict):
            for m in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
                if isinstance(m, dict) and isinstance(m.get("$ref"), str):
                    merged.add(m["$ref"])
            for v in node.values():
                members(v)
        elif isinstance(node, list):
            for v in node:
                members(v)

    def close(node: Any, path: str, in_all_of: bool) -> Any:
        if not isinstance(node, dict):
            return node
        out = dict(node)
        for key in _ONE:
            if key in out:
                out[key] = ([close(v, f"{path}/{key}/{i}", False) for i, v in enumerate(out[key])]
                            if isinstance(out[key], list) else close(out[key], f"{path}/{key}", False))
        for key in _LIST:
            if isinstance(out.get(key), list):
                out[key] = [close(v, f"{path}/{key}/{i}", key == "allOf") for i, v in enumerate(out[key])]
        for key in _MAP:
            if isinstance(out.get(key), dict):
                out[key] = {k: close(v, f"{path}/{key}/{k.replace('~', '~0').replace('/', '~1')}", False)
                            for k, v in out[key].items()}
        if out.get("type") == "integer":
            # the converter's integers have at most 16 digits (integral-part ::= [0] | [1-9] [0-9]{0,15}) where the
            # schema bounds neither side; llguidance's any number of digits: the model may write digits to the end
            if "minimum" not in out and "exclusiveMinimum" not in out:
                out["minimum"] = -(10**16 - 1)
            if "maximum" not in out and "exclusiveMaximum" not in out:
                out["maximum"] = 10**16 - 1
        if isinstance(out.get("properties"), dict) and "additionalProperties" not in out and not in_all_of \
                and path not in merged and not _COMBINED.intersection(out):
            out["additionalProperties"] = False
        return out

    members(schema)
    closed = close(schema, "#", False)
    closed["x-guidance"] = {**closed.get("x-guidance", {}), "whitespace_pattern": LLAMA_CPP_SPACE}
    return closed


def validate(schema: dict[str, Any], value: Any) -> str | None:
    """jsonschema's first error for `value`, or None. Its validator recurses a few Python frames a level (and a
    `$ref`): a chain of 5,000 `$ref`s needs more than Python's default 1,000."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 50_000))
    try:
        error = jsonschema.exceptions.best_match(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(value))
    finally:
        sys.setrecursionlimit(limit)
    return None if error is None else error.message[:160]


def given(item: dict[str, Any], engine: str, defaults: str, lenient: bool = False) -> Any:
    """The schema `engine` is given for `item` (llguidance's read as llama.cpp's converter reads it, by default;
    `lenient`: with llguidance's x-guidance lenient, which ignores the keywords it does not implement, as GBNF
    does, instead of refusing them)."""
    schema = item["schema"]
    if engine != "llguidance":
        return schema
    if defaults == "llama.cpp":
        schema = llama_cpp_reading(schema)
    if lenient and isinstance(schema, dict):
        schema = {**schema, "x-guidance": {**schema.get("x-guidance", {}), "lenient": True}}
    return schema


# JSON Schema's assertions (draft 2020-12 and earlier): the keywords a converter either enforces or drops
ASSERTIONS = ("uniqueItems", "not", "if", "then", "else", "propertyNames", "dependentSchemas", "dependentRequired",
              "dependencies", "minProperties", "maxProperties", "contains", "minContains", "maxContains",
              "multipleOf", "patternProperties", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
              "format", "pattern", "unevaluatedProperties", "unevaluatedItems", "additionalItems", "minLength",
              "maxLength", "minItems", "maxItems")
# values of those that assert nothing: dropping them loosens nothing
_NO_OPS = {"minItems": 0, "minLength": 0, "minProperties": 0, "minContains": 0, "uniqueItems": False}


def _without(node: Any, keyword: str, found: list[str]) -> Any:
    """`node` with `keyword` removed wherever it is a keyword of a subschema (not a property's name), not where its
    value asserts nothing; `found` gets one entry per removal."""
    if isinstance(node, list):
        return [_without(v, keyword, found) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == keyword and _NO_OPS.get(key, object()) != value:
            found.append(key)
        elif key in _ONE:
            out[key] = _without(value, keyword, found)
        elif key in _LIST and isinstance(value, list):
            out[key] = [_without(v, keyword, found) for v in value]
        elif key in _MAP and isinstance(value, dict):
            out[key] = {k: _without(v, keyword, found) for k, v in value.items()}
        else:
            out[key] = value
    return out


def gbnf_loosened(schema: Any) -> list[str]:
    """What llama.cpp's converter leaves out of `schema`'s grammar: each assertion whose removal (everywhere)
    leaves the converted grammar the same, and each pattern it reads as any string (its warning). Empty: every
    assertion the schema makes changes the grammar (a lower bound on what is dropped: a keyword enforced in one
    place and dropped in another counts as enforced)."""
    import logging

    from llamaplug.blocks.json_schema import schema_to_gbnf

    warned: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warned.append(record.getMessage())

    log = logging.getLogger("llamaplug.json_schema")
    catch = Catch()
    log.addHandler(catch)
    try:
        grammar = schema_to_gbnf(schema)
        dropped = [f"pattern read as any string: {w.split('pattern ', 1)[-1][:60]}" for w in warned]
        for keyword in ASSERTIONS:
            found: list[str] = []
            stripped = _without(schema, keyword, found)
            if found and keyword != "pattern" and schema_to_gbnf(stripped) == grammar:
                dropped.append(keyword)
    finally:
        log.removeHandler(catch)
    return dropped


def compile_one(llama: Any, item: dict[str, Any], engine: str, defaults: str = "llama.cpp",
                lenient: bool = False) -> dict[str, Any]:
    """Build the constraint alone (the GBNF converted and parsed, or llguidance's grammar and matcher), timed."""
    import llamaplug as lp
    from llamaplug.high.structured import constraint

    row: dict[str, Any] = {"engine": engine, "name": item["name"], "source": item["source"], "samples": []}
    t0 = time.perf_counter()
    try:
        built = constraint(llama.model, engine, json_schema=given(item, engine, defaults, lenient))
    except lp.LlamaError as exc:
        row.update(compiled=False, reason=str(exc)[:200], compile_ms=(time.perf_counter() - t0) * 1e3)
        return row
    row.update(compiled=True, compile_ms=(time.perf_counter() - t0) * 1e3)
    if isinstance(built, lp.LlamaSampler):
        built.close()
    # enforced: compiled with every assertion in force. llguidance strict refuses by name what it cannot enforce
    # (lenient ignores it: unknown); llama.cpp's converter drops some silently (gbnf_loosened says which)
    if engine == "gbnf":
        row["loosened"] = gbnf_loosened(item["schema"])
        row["enforced"] = not row["loosened"]
    else:
        row["enforced"] = None if lenient else True
    return row


def sample_all(llama: Any, work: list[tuple[dict[str, Any], dict[str, Any], int]],
               args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every (row, item, seed) sampled, n_seq_max at a time in the engine's shared batches (this machine is slow:
    one sequence at a time would take hours); each sample's result is added to its row. Each batch holds one
    engine's samples, the engines' batches alternating (the same schemas and seeds in the same order, where both
    compiled them); the wall time of each engine's batches over their tokens is its time per token (batched)."""
    by_engine = {e: [w for w in work if w[0]["engine"] == e] for e in ENGINES}
    width = llama.params.n_seq_max
    batches = [(e, by_engine[e][start:start + width]) for start in range(0, len(work), width) for e in ENGINES
               if by_engine[e][start:start + width]]
    timing = {e: {"seconds": 0.0, "tokens": 0, "batches": 0} for e in ENGINES}
    done_samples = 0
    for engine, part in batches:
        seconds, tokens = _sample_batch(llama, part, args)
        timing[engine]["seconds"] += seconds
        timing[engine]["tokens"] += tokens
        timing[engine]["batches"] += 1
        done_samples += len(part)
        print(f"sampled {done_samples}/{len(work)} ({engine}: {len(part)} in {seconds:.1f} s, {tokens} tokens)",
              file=sys.stderr)
    for t in timing.values():
        t["ms_per_token"] = round(t["seconds"] * 1e3 / t["tokens"], 3) if t["tokens"] else None
    return timing


def _sample_batch(llama: Any, part: list[tuple[dict[str, Any], dict[str, Any], int]],
                  args: argparse.Namespace) -> tuple[float, int]:
    """One batch sampled together; its wall time (jobs made and run) and the tokens it sampled."""
    import llamaplug as lp
    from llamaplug.high import events
    from llamaplug.high.jobs import collect_many, completion_job

    t0 = time.perf_counter()
    jobs, kept = [], []
    for row, item, seed in part:
        schema = given(item, row["engine"], args.defaults, args.lenient)
        form = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        try:
            chain = lp.SamplerChain().greedy() if seed is None else lp.SamplerChain(seed=seed).top_k(40).temp(0.7)
            jobs.append(completion_job(llama, args.prompt, args.max_tokens, chain, None, None, False, form, True,
                                       row["engine"]))
            kept.append((row, item, seed))
        except lp.LlamaError as exc:
            row["samples"].append({"error": str(exc)[:200]})
    try:
        done = collect_many(events.gather(llama.engine, jobs), jobs)
    except lp.LlamaError as exc:  # one job's failure fails the batch: each sampled again alone, to find whose
        if len(part) == 1:
            kept[0][0]["samples"].append({"seed": kept[0][2], "error": str(exc)[:300]})
            return time.perf_counter() - t0, 0
        seconds, tokens = time.perf_counter() - t0, 0
        for one in part:
            more = _sample_batch(llama, [one], args)
            seconds, tokens = seconds + more[0], tokens + more[1]
        return seconds, tokens
    seconds = time.perf_counter() - t0
    for (row, item, seed), out in zip(kept, done):
        sample: dict[str, Any] = {"seed": seed, "tokens": len(out.tokens),
                                  "finished": out.stop_reason.value != "max_tokens"}
        if sample["finished"]:
            try:
                sample["invalid"] = validate(item["schema"], json.loads(out.text))
            except ValueError as exc:
                sample["invalid"] = f"not JSON: {exc}"
            if sample["invalid"]:
                sample["text"] = out.text[:300]
        else:
            sample["text"] = out.text[-120:]  # where it was cut
        row["samples"].append(sample)
    return seconds, sum(len(out.tokens) for out in done)


def summary(rows: list[dict[str, Any]], timing: dict[str, dict[str, float]] | None = None) -> list[dict[str, Any]]:
    table = []
    sources = [s for s in ("pin", "hypothesis", "schemastore", "size-refused") if any(r["source"] == s for r in rows)]
    for source in sources + ["all"]:
        for engine in ENGINES:
            mine = [r for r in rows if r["engine"] == engine and source in ("all", r["source"])]
            if not mine:
                continue
            samples = [s for r in mine for s in r.get("samples", [])]
            finished = [s for s in samples if s.get("finished")]
            table.append({
                "source": source, "engine": engine, "schemas": len(mine),
                "compiled": sum(r["compiled"] for r in mine),
                "enforced": None if any(r.get("enforced") is None and r["compiled"] for r in mine)
                else sum(bool(r.get("enforced")) for r in mine),
                "sampled_schemas": sum(bool(r.get("samples")) for r in mine),
                "samples": len(samples), "errors": sum("error" in s for s in samples),
                "finished": len(finished), "valid": sum(not s.get("invalid") for s in finished),
                "compile_ms_median": round(statistics.median(r["compile_ms"] for r in mine if r["compiled"]), 2)
                if any(r["compiled"] for r in mine) else None,
                "ms_per_token_batched": (timing or {}).get(engine, {}).get("ms_per_token") if source == "all"
                else None,
            })
    return table


def markdown(table: list[dict[str, Any]]) -> str:
    lines = ["| source | engine | schemas | compiled | every assertion enforced | compile ms (median) | sampled "
             "schemas | valid / finished samples (of all) | errors | ms per token (batched) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for t in table:
        per = t.get("ms_per_token_batched")
        enforced = "?" if t.get("enforced") is None else t["enforced"]
        lines.append(f"| {t['source']} | {t['engine']} | {t['schemas']} | {t['compiled']} | {enforced} | "
                     f"{t['compile_ms_median']} | "
                     f"{t.get('sampled_schemas', '')} | {t['valid']}/{t['finished']} (of {t['samples']}) | "
                     f"{t['errors']} | {'' if per is None else per} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--hypothesis", type=int, default=30, help="schemas drawn from the Hypothesis strategy")
    ap.add_argument("--schemastore", help="a folder of SchemaStore *.json (default: check-jsonschema's vendored)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N schemas of the corpus (0: all)")
    ap.add_argument("--n", type=int, default=1, help="samples per schema and engine")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=36, help="sequences sampled together (n_seq_max)")
    ap.add_argument("--sample-limit", type=int, default=6,
                    help="sample only the first N schemas of each source (0: all; every schema is compiled; "
                    "the default keeps a run on this 2-core VM under an hour)")
    ap.add_argument("--prompt", default="A short JSON example:\n")
    ap.add_argument("--compile-only", action="store_true", help="compile every schema, sample none")
    ap.add_argument("--greedy", action="store_true", help="one greedy sample per schema and engine besides --n")
    ap.add_argument("--defaults", choices=("llama.cpp", "json-schema"), default="llama.cpp",
                    help="what llguidance reads where a schema leaves additionalProperties and whitespace open: "
                    "llama.cpp's converter's reading (closed, its space rule; the default) or JSON Schema's (open)")
    ap.add_argument("--lenient", action="store_true",
                    help="llguidance ignores the keywords it does not implement (x-guidance lenient), as GBNF "
                    "ignores uniqueItems, not, if/then: what it compiles at all, not what it enforces")
    ap.add_argument("--size-refused", action="store_true",
                    help="instead of the corpus: the schemas past each of the GBNF engine's size bounds "
                    "(size_refused_schemas), every one compiled and sampled")
    ap.add_argument("--out", default=str(HERE / "results" / "structured" /
                                         f"corpus-{time.strftime('%Y-%m-%dT%H%M')}.json"))
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)

    import llamaplug as lp
    from llamaplug.catalog import default_model
    from llamaplug.high.structured import constraint

    if args.size_refused:
        items = [{"source": "size-refused", "name": name, "schema": schema, "rank": 0}
                 for name, schema in size_refused_schemas().items()]
        notes = ["the schemas past each of the GBNF engine's size bounds"]
    else:
        items, notes = corpus(args)
    for note in notes:
        print(note, file=sys.stderr)
    rows = []
    room = args.max_tokens + len(args.prompt) + 16  # a sequence's prompt and reply: a token is a character or more
    with lp.Llama.load(lp.LlamaParams(model_path=default_model(args.model), n_ctx=args.parallel * room,
                                      n_seq_max=args.parallel, n_threads=args.threads)) as llama:
        constraint(llama.model, "llguidance", json_schema={"type": "object"}).close()  # the tokenizer, made once
        work = []
        for i, item in enumerate(items):
            for engine in ENGINES if i % 2 == 0 else reversed(ENGINES):  # alternate: a slow spell hits both
                row = compile_one(llama, item, engine, args.defaults, args.lenient)
                rows.append(row)
                print(f"{item['name']:>24} {engine:10} {'ok' if row['compiled'] else 'REFUSED':7} "
                      f"{row['compile_ms']:8.1f} ms  {row.get('reason', '')[:90]}", file=sys.stderr)
                if row["compiled"] and (not args.sample_limit or item["rank"] < args.sample_limit):
                    work += [(row, item, None)] * args.greedy + [(row, item, 1000 + k) for k in range(args.n)]
        timing = None if args.compile_only else sample_all(llama, work, args)
    table = summary(rows, timing)
    result = {"model": args.model, "max_tokens": args.max_tokens, "n": args.n, "greedy": args.greedy,
              "threads": args.threads, "parallel": args.parallel, "defaults": args.defaults, "lenient": args.lenient,
              "sampler": "top_k 40, temperature 0.7, seeds 1000.. (and greedy where --greedy)",
              "load_average_at_end": list(os.getloadavg()), "notes": notes, "table": table, "timing": timing,
              "rows": rows}
    print(markdown(table))
    if not args.no_save:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"saved {args.out}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
