#!/usr/bin/env python3
"""The most any drafter can give on this machine: what a verify batch costs against single-token decodes.

    .tox/py/bin/python bench/drafting_ceiling.py [--models smollm2,gemma] [--drafting FILE] [--out FILE]

A drafter's best case is every guess accepted: a batch of k rows (the next token and k - 1 guesses, logits on
every row, as a verify batch asks) gives k tokens for the price of that batch. So k / cost(k rows in single
decodes) bounds the generation speed-up of drafts of k - 1 guesses, whatever the drafter. Measured here with
llamaplug's context (on the engine's thread, 2 threads, after a 400-token prompt, median of 5), beside the pin's
`llama-bench` pp / tg of the same sizes (logits on the last row only: a lower price than verifying).

With `--drafting` (a `bench/serving.py drafting` result), the wall-clock bound of its copy chats at one client
too: the prompt's reading is the same with or without drafts, so with a share p of llama-server's default wall
time spent generating, no drafter passes 1 / ((1 - p) + p / bound).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import serving  # noqa: E402

ROWS = (1, 9, 17, 33, 65)


def ours(model: Path, threads: int) -> dict[int, float]:
    """Seconds of a decode of k rows with logits on every row (median of 5), for each k in ROWS."""
    import llamaplug as lp

    with lp.Llama.load(lp.LlamaParams(model, n_ctx=2048, n_threads=threads, n_threads_batch=threads)) as llama:
        ctx = llama.context
        prompt = llama.tokenize("The quick brown fox jumps over the lazy dog. " * 40)[:400]

        def measure() -> dict[int, float]:
            ctx.clear_cache()
            batch = lp.LlamaBatch(512, 1)
            batch.add_sequence(prompt, 0, False)
            ctx.decode(batch)
            out = {}
            for k in ROWS:
                times = []
                for _ in range(5):
                    rows = lp.LlamaBatch(k, 1)
                    rows.add_sequence(prompt[:k], 0, True, len(prompt))
                    t0 = time.perf_counter()
                    ctx.decode(rows)
                    times.append(time.perf_counter() - t0)
                    ctx.kv_cache_seq_rm(0, len(prompt), -1)
                out[k] = statistics.median(times)
            return out

        llama.engine.call(measure)  # a first pass pages the weights in
        return llama.engine.call(measure)


def native(model: Path, threads: int) -> dict[str, float]:
    """llama-bench's tg128 and pp of each size in ROWS above 1, tokens/s."""
    sizes = ",".join(str(k) for k in ROWS if k > 1)
    out = subprocess.run([str(serving.native_bin() / "llama-bench"), "-m", str(model), "-t", str(threads),
                          "-p", sizes, "-n", "128", "-r", "3", "-o", "json"], capture_output=True, text=True,
                         check=True).stdout
    rows = json.loads(out)
    result = {f"pp{r['n_prompt']}": r["avg_ts"] for r in rows if r["n_prompt"]}
    result["tg128"] = next(r["avg_ts"] for r in rows if r["n_gen"])
    return result


def generation_share(drafting: Path) -> float:
    """The share of llama-server's default wall time spent generating on the copy chats at one client: its
    wall tokens/s over its generation tokens/s (medians)."""
    result = json.loads(drafting.read_text())["result"]
    wall = statistics.median(result["runs"]["copy/1"]["native"])
    gen = statistics.median(result["generation_runs"]["copy/1"]["native"])
    return wall / gen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,gemma")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafting", type=Path, action="append", default=[],
                    help="a bench/serving.py drafting result (once per model, matched by its model file)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    shares = {}
    for path in args.drafting:
        if "generation_runs" not in json.loads(path.read_text())["result"]:
            raise SystemExit(f"{path} has no generation_runs (drafting results from 2026-11-29 12:00 on have)")
        shares[json.loads(path.read_text())["result"]["model"]] = (generation_share(path), path.name)
    report = {}
    for name in args.models.split(","):
        model = serving.model_path(name)
        cost = ours(model, args.threads)
        bound = {k: k / (cost[k] / cost[1]) for k in ROWS if k > 1}
        entry = {"single_decode_ms": 1e3 * cost[1], "rows_in_single_decodes": {k: cost[k] / cost[1] for k in ROWS},
                 "generation_bound": bound, "llama_bench": native(model, args.threads)}
        print(f"{model.name}: a decode {1e3 * cost[1]:.2f} ms; k rows cost "
              + ", ".join(f"{k}: {cost[k] / cost[1]:.2f}" for k in ROWS if k > 1)
              + " decodes; all guesses accepted: " + ", ".join(f"{k - 1} guesses {b:.2f}x" for k, b in bound.items()),
              flush=True)
        lb = entry["llama_bench"]
        pp = ", ".join(f"{k} {v / lb['tg128']:.2f}x" for k, v in lb.items() if k != "tg128")
        print(f"  llama-bench: tg128 {lb['tg128']:.1f} t/s; pp over tg: {pp}")
        if model.name in shares:
            p, source = shares[model.name]
            best = max(bound.values())
            entry["copy_1_client"] = {"generation_share": p, "from": source, "wall_bound": 1 / ((1 - p) + p / best)}
            print(f"  copy chats at one client ({source}): llama-server's default spends {p:.2f} of its wall time "
                  f"generating; no drafter passes {entry['copy_1_client']['wall_bound']:.2f}x its wall tokens/s",
                  flush=True)
        report[model.name] = entry
    if args.out:
        args.out.write_text(json.dumps({"argv": sys.argv[1:], "cpu_count": os.cpu_count(), "models": report},
                                       indent=1))


if __name__ == "__main__":
    main()
