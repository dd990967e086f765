"""bench/structured_corpus.py runs (issue 42 part 4): three schemas of the corpus through both engines, compiled and
sampled, and its Hypothesis strategy draws the same schemas every run. The bench's numbers are not asserted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jsonschema

BENCH = Path(__file__).resolve().parents[3] / "bench" / "structured_corpus.py"


def _bench():
    spec = importlib.util.spec_from_file_location("structured_corpus", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_corpus_bench_runs_on_three_schemas(capsys) -> None:
    bench = _bench()
    result = bench.main(["--limit", "3", "--hypothesis", "2", "--max-tokens", "6", "--parallel", "6", "--threads",
                         "2", "--schemastore", str(BENCH.parent), "--no-save"])  # a folder without *.json: none
    rows = result["rows"]
    assert sorted((r["engine"], r["name"]) for r in rows) == sorted(
        (e, n) for e in bench.ENGINES for n in {r["name"] for r in rows}) and len(rows) == 6
    for row in rows:
        assert row["compiled"], row  # the pin's first schemas: both engines take them
        assert len(row["samples"]) == 1 and "error" not in row["samples"][0], row
        assert not row["samples"][0].get("invalid"), row
    by = {(t["source"], t["engine"]): t for t in result["table"]}
    assert by[("all", "gbnf")]["schemas"] == 3 and by[("all", "llguidance")]["compiled"] == 3
    assert "| all | llguidance | 3 | 3 |" in capsys.readouterr().out


def test_the_hypothesis_schemas_are_schemas_and_the_same_each_run() -> None:
    bench = _bench()
    drawn = bench.hypothesis_schemas(5)
    assert len(drawn) == 5 and drawn == bench.hypothesis_schemas(5)
    for schema in drawn:
        jsonschema.Draft202012Validator.check_schema(schema)
