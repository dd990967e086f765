#!/usr/bin/env python3
"""Sampling costs as ratios, measured in one process with interleaved rounds.

    .venv/bin/python bench/sampling.py                       # tg ratios (about 3 min)
    .venv/bin/python bench/sampling.py --schemas --n 100     # JSON-schema outputs: 100 per schema

tg ratios (generation tokens/s, the median over rounds, the same prompt and seed):
- a chain with a no-op Python sampler plugin in it vs the same chain without it (target >= 0.97);
- generation under a JSON-schema grammar vs the same chain unconstrained (target >= 0.8).
--schemas generates `--n` texts per schema of tests/json_schemas.py under its grammar and
checks every finished one with jsonschema; texts cut at max_tokens are counted apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

# Long outputs, so a round's rate is over many tokens: up to 50 strings of up to 30 characters.
LONG_SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 50}


def tg(llama, chain_factory, response_format=None, tokens=96) -> float:
    out = llama.create_completion("Here is a list of fruits and vegetables:", tokens, sampler=chain_factory(),
                                  response_format=response_format)
    return out.timings.predicted_per_second


def ratios(llama, rounds: int) -> dict:
    import llamaplug as lp

    def base():
        return lp.SamplerChain(seed=7).top_k(40).temp(0.9)

    def with_noop():
        return lp.SamplerChain(seed=7).top_k(40).add("noop").temp(0.9)

    runs: dict[str, list[float]] = {"base": [], "noop": [], "free": [], "grammar": []}
    tg(llama, base)  # warm-up
    for _ in range(rounds):  # ABCD, DCBA, ...: a slow spell hits both sides of a ratio
        order = [("base", base, None), ("noop", with_noop, None), ("free", base, None),
                 ("grammar", base, {"type": "json_object", "schema": LONG_SCHEMA})]
        for name, factory, fmt in order if _ % 2 == 0 else reversed(order):
            runs[name].append(tg(llama, factory, fmt))
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {"tokens_per_s": med, "rounds": runs,
            "noop_plugin_vs_without": med["noop"] / med["base"],
            "json_grammar_vs_free": med["grammar"] / med["free"]}


def schemas(llama, n: int) -> dict:
    import jsonschema
    from json_schemas import SCHEMAS

    import llamaplug as lp

    rows = []
    for i, schema in enumerate(SCHEMAS):
        finished = valid = 0
        t0 = time.perf_counter()
        for seed in range(n):
            out = llama.create_completion("JSON:", 200, sampler=lp.SamplerChain(seed=seed).top_k(40).temp(1.0),
                                          response_format={"type": "json_object", "schema": schema})
            if out.stop_reason == lp.StopReason.EOS:
                finished += 1
                try:
                    jsonschema.validate(json.loads(out.text), schema)
                    valid += 1
                except (ValueError, jsonschema.ValidationError) as exc:
                    print(f"schema {i}: INVALID {out.text!r}: {exc}", file=sys.stderr)
        rows.append({"schema": i, "n": n, "finished": finished, "valid": valid,
                     "seconds": round(time.perf_counter() - t0, 1)})
        print(f"schema {i:2}: {finished}/{n} finished, {valid}/{finished} valid  {json.dumps(schema)[:60]}",
              flush=True)
    return {"schemas": rows, "finished": sum(r["finished"] for r in rows), "valid": sum(r["valid"] for r in rows),
            "generated": n * len(SCHEMAS)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--schemas", action="store_true")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()

    import llamaplug as lp
    from llamaplug.catalog import default_model

    llama = lp.Llama.load(lp.LlamaParams(default_model("smollm2-135m-instruct"), n_ctx=2048,
                                         n_threads=a.threads))
    result = schemas(llama, a.n) if a.schemas else ratios(llama, a.rounds)
    summary = {k: v for k, v in result.items() if k not in ("rounds", "schemas")}
    print(json.dumps(summary, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
