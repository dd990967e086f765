#!/usr/bin/env python3
"""A corpus of JSON schemas through both structured engines (issue 42 part 4): compiles?, do the sampled outputs
validate, time to compile, time per token. A bench, not a timed test.

    .tox/py/bin/python bench/structured_corpus.py                   # the whole corpus, SmolLM2, 1 sample each
    .tox/py/bin/python bench/structured_corpus.py --limit 3 --max-tokens 8 --no-save   # a smoke run

The corpus (each schema tagged with its source):
- pin: the JSON schemas in the pinned llama.cpp's tests (tests/test-json-schema-to-grammar.cpp and
  tests/test-grammar-integration.cpp: every raw-string literal that parses as a JSON schema object);
- hypothesis: schemas drawn (derandomized, so the same every run) from a Hypothesis strategy of nested objects,
  arrays, anyOf, $ref/$defs, enums, integer and length bounds, patterns and formats;
- schemastore: real-world schemas from SchemaStore as the PyPI package check-jsonschema (0.39.0) vendors them
  (check_jsonschema/builtin_schemas/vendor/*.json: GitHub workflows, GitLab CI, Renovate, compose, ...);
  skipped with a note when it is not installed (`pip install check-jsonschema==0.39.0`, or --schemastore DIR).

Engines: "gbnf" (blocks/json_schema.py: llama.cpp's own converter, common/json-schema-to-grammar.cpp of the pin,
through the shim, behind our size bounds; the pin ships no json_schema_to_grammar.py script any more, so that
converter is llama.cpp's converter) and "llguidance" (the llamaplug-llguidance plugin's sampler).
For each schema and engine: compiled (the constraint built: GBNF converted and parsed by llama.cpp, or
llguidance's grammar and matcher) or the reason it was refused, the time that took, then `--n` samples
(top_k 40, temperature 0.7, fixed seeds, the same for both engines) of at most `--max-tokens`, sampled
`--parallel` at a time in the engine's batches: finished (not cut at max_tokens), valid (jsonschema, formats
checked). Schemas jsonschema itself rejects are left out. Time per token: bench/structured_speed.py (one sequence,
interleaved rounds), since a token's time in a shared batch is not one schema's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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


def validate(schema: dict[str, Any], value: Any) -> str | None:
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    error = jsonschema.exceptions.best_match(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(value))
    return None if error is None else error.message[:160]


def compile_one(llama: Any, item: dict[str, Any], engine: str) -> dict[str, Any]:
    """Build the constraint alone (the GBNF converted and parsed, or llguidance's grammar and matcher), timed."""
    import llamaplug as lp
    from llamaplug.high.structured import constraint

    row: dict[str, Any] = {"engine": engine, "name": item["name"], "source": item["source"], "samples": []}
    t0 = time.perf_counter()
    try:
        built = constraint(llama.model, engine, json_schema=item["schema"])
    except lp.LlamaError as exc:
        row.update(compiled=False, reason=str(exc)[:200], compile_ms=(time.perf_counter() - t0) * 1e3)
        return row
    row.update(compiled=True, compile_ms=(time.perf_counter() - t0) * 1e3)
    if isinstance(built, lp.LlamaSampler):
        built.close()
    return row


def sample_all(llama: Any, work: list[tuple[dict[str, Any], dict[str, Any], int]], args: argparse.Namespace) -> None:
    """Every (row, item, seed) sampled, n_seq_max at a time in the engine's shared batches (this machine is slow:
    one sequence at a time would take hours); each sample's result is added to its row."""
    import llamaplug as lp
    from llamaplug.high import events
    from llamaplug.high.jobs import collect_many, completion_job

    width = llama.params.n_seq_max
    for start in range(0, len(work), width):
        part, jobs, kept = work[start:start + width], [], []
        for row, item, seed in part:
            form = {"type": "json_schema", "json_schema": {"name": "x", "schema": item["schema"]}}
            try:
                jobs.append(completion_job(llama, args.prompt, args.max_tokens,
                                           lp.SamplerChain(seed=seed).top_k(40).temp(0.7), None, None, False, form,
                                           True, row["engine"]))
                kept.append((row, item))
            except lp.LlamaError as exc:
                row["samples"].append({"error": str(exc)[:200]})
        try:
            done = collect_many(events.gather(llama.engine, jobs), jobs)
        except lp.LlamaError as exc:  # one job's failure fails the batch: record it against each
            for row, _ in kept:
                row["samples"].append({"error": f"batch: {str(exc)[:200]}"})
            continue
        for (row, item), out in zip(kept, done):
            sample: dict[str, Any] = {"tokens": len(out.tokens), "finished": out.stop_reason.value != "max_tokens"}
            if sample["finished"]:
                try:
                    sample["invalid"] = validate(item["schema"], json.loads(out.text))
                except ValueError as exc:
                    sample["invalid"] = f"not JSON: {exc}"
                if sample["invalid"]:
                    sample["text"] = out.text[:300]
            row["samples"].append(sample)
        print(f"sampled {min(start + width, len(work))}/{len(work)}", file=sys.stderr)


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    table = []
    for source in ("pin", "hypothesis", "schemastore", "all"):
        for engine in ENGINES:
            mine = [r for r in rows if r["engine"] == engine and source in ("all", r["source"])]
            if not mine:
                continue
            samples = [s for r in mine for s in r.get("samples", [])]
            finished = [s for s in samples if s.get("finished")]
            table.append({
                "source": source, "engine": engine, "schemas": len(mine),
                "compiled": sum(r["compiled"] for r in mine),
                "samples": len(samples), "errors": sum("error" in s for s in samples),
                "finished": len(finished), "valid": sum(not s.get("invalid") for s in finished),
                "compile_ms_median": round(statistics.median(r["compile_ms"] for r in mine if r["compiled"]), 2)
                if any(r["compiled"] for r in mine) else None,
            })
    return table


def markdown(table: list[dict[str, Any]]) -> str:
    lines = ["| source | engine | schemas | compiled | valid / finished samples (of all) | errors | "
             "compile ms (median) |", "|---|---|---|---|---|---|---|"]
    for t in table:
        lines.append(f"| {t['source']} | {t['engine']} | {t['schemas']} | {t['compiled']} | "
                     f"{t['valid']}/{t['finished']} (of {t['samples']}) | {t['errors']} | {t['compile_ms_median']} |")
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
    ap.add_argument("--out", default=str(HERE / "results" / "structured" /
                                         f"corpus-{time.strftime('%Y-%m-%dT%H%M')}.json"))
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)

    import llamaplug as lp
    from llamaplug.catalog import default_model
    from llamaplug.high.structured import constraint

    items, notes = corpus(args)
    for note in notes:
        print(note, file=sys.stderr)
    rows = []
    with lp.Llama.load(lp.LlamaParams(model_path=default_model(args.model), n_ctx=args.parallel * 256,
                                      n_seq_max=args.parallel, n_threads=args.threads)) as llama:
        constraint(llama.model, "llguidance", json_schema={"type": "object"}).close()  # the tokenizer, made once
        work = []
        for i, item in enumerate(items):
            for engine in ENGINES if i % 2 == 0 else reversed(ENGINES):  # alternate: a slow spell hits both
                row = compile_one(llama, item, engine)
                rows.append(row)
                print(f"{item['name']:>24} {engine:10} {'ok' if row['compiled'] else 'REFUSED':7} "
                      f"{row['compile_ms']:8.1f} ms  {row.get('reason', '')[:90]}", file=sys.stderr)
                if row["compiled"] and (not args.sample_limit or item["rank"] < args.sample_limit):
                    work += [(row, item, 1000 + k) for k in range(args.n)]
        if not args.compile_only:
            sample_all(llama, work, args)
    table = summary(rows)
    result = {"model": args.model, "max_tokens": args.max_tokens, "n": args.n, "notes": notes, "table": table,
              "rows": rows}
    print(markdown(table))
    if not args.no_save:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"saved {args.out}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
