#!/usr/bin/env python3
"""Generation speed, llamaplug against llama-bench, alternated every 128 tokens.

    .venv/bin/python bench/ab_tg.py --pairs 40

bench/run.py alternates whole processes, a minute each; on a shared machine a slow
spell lasts about as long, so one side of a ratio can fall in it and the other not.
Here llamaplug stays loaded in this process and every repetition alternates (in
ABC CBA order) with one `llama-bench -p 0 -n 128 -r 1` run, a second or two each:

- native: llama-bench's tg128 (random tokens from position 0, as llama-bench feeds them);
- raw: the same loop from Python, llama_decode through llamaplug.raw, no llamaplug code (on the engine's
  thread, Engine.call);
- create_completion: the public API, greedy, after the bench's short prompt.

The median of the per-pair ratios, with quartiles, is printed: raw/native is the
cost of hosting llama.cpp in a Python process, create_completion/raw llamaplug's own.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import TG_TEXT  # noqa: E402
from run import native_tools  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file (default: the catalog's smollm2-135m-instruct)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--pairs", type=int, default=40)
    a = ap.parse_args()

    import llamaplug as lp
    from llamaplug.catalog import default_model
    from llamaplug.raw import lib

    model = a.model or default_model("smollm2-135m-instruct")
    bench_bin = native_tools("cpu") / "llama-bench"
    n = a.tokens
    llama = lp.Llama.load(lp.LlamaParams(model, n_ctx=2048, n_threads=a.threads, n_threads_batch=a.threads))
    prompt = llama.tokenize(TG_TEXT)
    ctx, n_vocab = llama.context, llama.model.n_vocab

    def native() -> float:
        out = subprocess.run([str(bench_bin), "-m", str(model), "-t", str(a.threads), "-r", "1", "-p", "0",
                              "-n", str(n), "-o", "json"], capture_output=True, text=True, check=True).stdout
        return float(json.loads(out)[0]["avg_ts"])

    def raw() -> float:
        ctx.clear_cache()
        one, ptr, decode = ctx._one, ctx._ptr, lib.llama_decode
        c_batch = one.c_batch()
        tokens = [random.randrange(n_vocab) for _ in range(n)]
        t0 = time.perf_counter()
        for pos, token in enumerate(tokens):
            one.token[0] = token
            one.pos[0] = pos
            if decode(ptr, c_batch):
                raise RuntimeError("llama_decode failed")
        return n / (time.perf_counter() - t0)

    def create_completion() -> float:
        c = llama.create_completion(prompt, max_tokens=n + 1)  # n decodes after the prompt
        return n / (c.timings.predicted_ms / 1e3)

    # raw decodes on the engine's thread, where create_completion's do: decodes from a second thread would
    # give OpenMP a second team and slow both (high/engine.py)
    runs = {"native": native, "raw": lambda: llama.engine.call(raw), "create_completion": create_completion}
    for fn in runs.values():
        fn()  # warm-up
    rates: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for i in range(a.pairs):
        for name in order if i % 2 == 0 else order[::-1]:
            rates[name].append(runs[name]())
    print(f"{Path(model).name}, {a.threads} threads, tg{n}, {a.pairs} alternations")
    for name, values in rates.items():
        print(f"  {name:18} median {statistics.median(values):6.1f} t/s")
    for num, den in (("raw", "native"), ("create_completion", "native"), ("create_completion", "raw")):
        q1, q2, q3 = statistics.quantiles([x / y for x, y in zip(rates[num], rates[den])], n=4)
        print(f"  {num + '/' + den:28} {q2:.3f}  (quartiles {q1:.3f} .. {q3:.3f})")
    llama.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
