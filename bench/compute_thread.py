#!/usr/bin/env python3
"""Generation before and after other work computed in the same process, for two trees (bench/ab_engine.py's dirs).

    .tox/py/bin/python bench/compute_thread.py --a DIR_BEFORE --b DIR_AFTER [--rounds 2] [--out FILE]

The CPU backend's threads are OpenMP's: every thread that computes keeps a team of them, and once their count
passes the cores each barrier between graph nodes sleeps (high/engine.py). What is measured, each in a fresh
process (a server: a fresh `llamaplug serve`), 2 threads: a Llama's greedy generation (128 tokens, tokens/s of its
timings) four times, then the other work once, then four times again; the value is after / before (medians):

- embed: `embed` of one text on the caller's thread;
- second: a second Llama of the same model (an embedding model beside the chat one) embeds one text, then
  `--idle` seconds pass (an engine's worker that ends when idle takes its OpenMP team with it);
- serve: a `/v1/embeddings` request between `/completion` requests.

Rounds run A B, then B A.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import serving  # noqa: E402
from ab_engine import PRELUDE, serve_tree, tree_options  # noqa: E402

PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"

WORKER = PRELUDE + r"""
import json, statistics, time
import llamaplug as lp
assert lp.__file__.startswith(sys.argv[3]), lp.__file__
model, kind, idle = sys.argv[1], sys.argv[2], float(sys.argv[4])
chat = lp.Llama.load(lp.LlamaParams(model, n_ctx=1024, n_threads=2, n_threads_batch=2, cache_ram_mib=0))
def gen():
    return chat.create_completion(PROMPT, 128, temperature=0).timings.predicted_per_second
before = [gen() for _ in range(4)]
if kind == "embed":
    chat.embed(["hello world"])
else:
    other = lp.Llama.load(lp.LlamaParams(model, n_ctx=256, n_threads=2, n_threads_batch=2, cache_ram_mib=0))
    other.embed(["hello world"])
    time.sleep(idle)
after = [gen() for _ in range(4)]
print(json.dumps([statistics.median(before), statistics.median(after)]))
""".replace("PROMPT", repr(PROMPT))


def in_process(tree: Path, model: Path, kind: str, idle: float) -> list[float]:
    out = subprocess.run([sys.executable, "-c", WORKER, str(model), kind, str(tree), str(idle)],
                         env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as got:
        return json.load(got)


def served(tree: Path, model: Path) -> list[float]:
    proc, port = serve_tree(tree, model, "-t", "2", "--parallel", "1", "-c", "1024", "--spec-type", "none")
    body = {"prompt": PROMPT, "n_predict": 128, "temperature": 0, "cache_prompt": False}
    try:
        def gen() -> float:
            return _post(port, "/completion", body)["timings"]["predicted_per_second"]
        before = [gen() for _ in range(4)]
        _post(port, "/v1/embeddings", {"input": "hello world"})
        after = [gen() for _ in range(4)]
    finally:
        serving.stop(proc)
    return [statistics.median(before), statistics.median(after)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tree_options(ap)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--idle", type=float, default=3.0, help="seconds between the second Llama's work and the rest")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    model = serving.model_path(args.model)
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    runs: dict[str, dict[str, list[list[float]]]] = {k: {"A": [], "B": []} for k in ("embed", "second", "serve")}
    for r in range(args.rounds):
        for kind in runs:
            for name in (["A", "B"] if r % 2 == 0 else ["B", "A"]):
                value = served(trees[name], model) if kind == "serve" else in_process(trees[name], model, kind,
                                                                                       args.idle)
                runs[kind][name].append(value)
                print(f"round {r + 1} {kind} {name}: before {value[0]:.1f}, after {value[1]:.1f} tok/s "
                      f"({value[1] / value[0]:.2f}x)", flush=True)
    summary = {kind: {name: {"runs": values, "after_over_before": statistics.median(a / b for b, a in values)}
                      for name, values in by.items()} for kind, by in runs.items()}
    for kind, by in summary.items():
        print(f"{kind}: after/before A {by['A']['after_over_before']:.2f}, B {by['B']['after_over_before']:.2f}")
    result = {"argv": sys.argv[1:], "cpu_count": os.cpu_count(), "model": model.name, "runs": summary}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
