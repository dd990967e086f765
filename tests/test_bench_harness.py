"""The benchmark harness's arithmetic (bench/run.py): what it reports from the rounds it measured.

Measuring is bench/run.py's job and takes half an hour; these check, on the result
files committed in bench/results/ (real runs), that the tables and targets are what
the rounds say.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
_PATH = list(sys.path)
sys.path.insert(0, str(BENCH))
import run  # noqa: E402
from _shared import Workload  # noqa: E402

# The bench's scripts put bench/ (and, through peer_env, backend_cpu's source folder) first on sys.path: fine for a
# script, but here it was every later test file's path too (their `variants`, `probe`, `run` were importable).
sys.path[:] = _PATH

RESULTS = sorted((BENCH / "results").glob("*.json"))


def load(path: Path) -> tuple[dict, Workload]:
    result = json.loads(path.read_text())
    return result, Workload.from_json(json.dumps(result["workload"]))


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_tables_are_recomputed_from_the_stored_rounds(path):
    # The stored table was written by the harness of that day; today's must agree with it.
    result, w = load(path)
    for entry in result["models"].values():
        stored = {row["metric"]: row for row in entry["table"]}
        table = run.aggregate(entry["rounds"], w)
        assert {row["metric"] for row in table} >= set(stored)
        for row in table:
            old = stored.get(row["metric"])
            if old is None:
                continue
            for impl in ("native", "llamaplug", "peer"):
                assert (row[impl] or {}).get("median") == pytest.approx((old[impl] or {}).get("median"))
            for ratio in ("ours/native", "ours/peer"):
                assert row[ratio] == pytest.approx(old[ratio])


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_paired_ratio_is_the_median_of_each_rounds_ratio(path):
    result, w = load(path)
    for entry in result["models"].values():
        rounds = entry["rounds"]
        table = run.aggregate(rounds, w)
        row = next(r for r in table if r["metric"] == f"tg{w.tg} t/s (create_completion)")
        per_round = [r["llamaplug"]["tg"]["tps"] / r["native"]["tg"]["tps"] for r in rounds
                     if r.get("native") and r.get("llamaplug")]
        assert row["paired ours/native"]["median"] == pytest.approx(statistics.median(per_round))
        assert row["paired ours/native"]["n"] == len(per_round)
        goal = next(t for t in run.targets(table, run.scaling(rounds, w), w)
                    if t["target"] == "tg >= 0.98x native")
        assert goal["paired"] == pytest.approx(statistics.median(per_round))
        assert goal["met"] == (row["ours/native"] >= 0.98)


def test_paired_ratio_skips_rounds_that_lack_a_side():
    rounds = [
        {"native": {"tg": {"tps": 100.0}}, "llamaplug": {"tg": {"tps": 90.0}}},
        {"native": {"tg": {"tps": 50.0}}, "llamaplug": {"tg": {"tps": 50.0}}},  # a slow spell hits both
        {"native": {"tg": {"tps": 100.0}}},  # llamaplug failed this round
    ]
    row = next(r for r in run.aggregate(rounds, Workload(batch_npl=()))
               if r["metric"] == "tg128 t/s (create_completion)")
    assert row["paired ours/native"]["samples"] == [0.9, 1.0]
    assert row["ours/native"] == pytest.approx(70.0 / 100.0)  # medians: (90, 50) -> 70, (100, 50, 100) -> 100


def test_render_prints_an_earlier_file():
    path = next(p for p in RESULTS if "gemma" in json.loads(p.read_text())["models"])
    r = subprocess.run([sys.executable, str(BENCH / "run.py"), "--render", str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{path.name}: ")
    tg = next(ln for ln in r.stdout.splitlines() if "tg >= 0.98x native" in ln and "(paired " in ln)
    assert tg.split()[-1] in ("met", "MISSED")


def test_prompt_rate_reads_the_whole_prompt_every_run(llama):
    # The engine keeps a slot's tokens for a later request with the same prefix; prompt_rate must
    # forget them between runs (it raises if a run reused any), or pp reports one token's time.
    from llamaplug.bench import prompt_rate

    tokens = llama.tokenize("The history of the bicycle begins in the early nineteenth century. " * 8)
    llama.create_completion(tokens, max_tokens=1)  # a cached copy for the first run to find
    reused = llama.engine.stats.cached_tokens
    out = prompt_rate(llama, tokens, 3)
    assert out["tokens"] == len(tokens) and len(out["samples_ms"]) == 3
    assert llama.engine.stats.cached_tokens == reused
