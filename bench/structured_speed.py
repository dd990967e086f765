#!/usr/bin/env python3
"""Constrained generation's speed against free generation, per structured engine, as ratios (issue 42 part 4).

    .tox/py/bin/python bench/structured_speed.py [--models smollm2-135m-instruct gemma-3-270m] [--rounds 5]

For each model, in one process, rounds of three runs in alternating order (ABC, CBA, ...: a slow spell on a shared
machine hits every side of a ratio): the same prompt, chain (top_k 40, temperature 0.9, seed 7) and length,
free, under a JSON schema with the "gbnf" engine (llama.cpp's grammar sampler) and with "llguidance" (the
plugin's sampler). Printed: each engine's tokens/s over free's, the median of per-round ratios (issue 42's target:
>= 0.95), and llguidance's mask time per token: the plugin sampler's apply (llguidance's bitmask filled, then
applied to a whole vocabulary of candidates with numpy) and its accept, timed alone along a text the schema
accepts. Absolute times on a loaded VM mean little: ratios only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROMPT = "Here is a list of fruits and vegetables:"
# Long outputs (as bench/sampling.py's): a round's rate is over many tokens.
SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 50}


def model_path(name: str) -> Path:
    from llamaplug.catalog import default_model, entries

    entry = next((e for e in entries() if e.name == name), None)
    found = entry.locate() if entry is not None else None
    return Path(found) if found is not None else default_model(name)


def tg(llama: Any, engine: str | None, tokens: int) -> tuple[float, list[int]]:
    import llamaplug as lp

    form = None if engine is None else {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    out = llama.create_completion(PROMPT, tokens, sampler=lp.SamplerChain(seed=7).top_k(40).temp(0.9),
                                  response_format=form, structured_engine=engine)
    return out.timings.predicted_per_second, out.tokens


class _Candidates:
    """What the plugin sampler's apply reads and writes: every token of the vocabulary as a candidate."""

    def __init__(self, n_vocab: int):
        import numpy as np

        self.ids = np.arange(n_vocab, dtype=np.int32)
        self.logits = np.zeros(n_vocab, dtype=np.float32)


def mask_time(llama: Any, tokens: list[int]) -> dict[str, float]:
    """The llguidance sampler's apply and accept along `tokens` (a text the schema accepts), per token, in µs."""
    from llamaplug_llguidance.sampler import make_sampler

    sampler = make_sampler(llama.model, json_schema=SCHEMA)
    candidates = _Candidates(llama.model.n_vocab)
    apply_us, accept_us = [], []
    for token in tokens:
        candidates.logits[:] = 0
        t0 = time.perf_counter()
        sampler.apply(candidates)
        t1 = time.perf_counter()
        if not sampler.matcher.consume_token(token):
            break
        t2 = time.perf_counter()
        apply_us.append((t1 - t0) * 1e6)
        accept_us.append((t2 - t1) * 1e6)
    return {"tokens": len(apply_us), "apply_us_median": round(statistics.median(apply_us), 1),
            "accept_us_median": round(statistics.median(accept_us), 1)}


def bench_model(name: str, rounds: int, tokens: int, threads: int) -> dict[str, Any]:
    import llamaplug as lp

    runs: dict[str, list[float]] = {"free": [], "gbnf": [], "llguidance": []}
    with lp.Llama.load(lp.LlamaParams(model_path=model_path(name), n_ctx=1024, n_threads=threads)) as llama:
        tg(llama, "llguidance", 8)  # warm-up: the llguidance tokenizer is made once per model
        tg(llama, "gbnf", 8)
        order = [("free", None), ("gbnf", "gbnf"), ("llguidance", "llguidance")]
        kept: list[int] = []
        for r in range(rounds):
            for label, engine in order if r % 2 == 0 else reversed(order):
                rate, out = tg(llama, engine, tokens)
                runs[label].append(rate)
                if label == "llguidance":
                    kept = out
            print(f"{name} round {r}: " + ", ".join(f"{k} {v[-1]:.1f} t/s" for k, v in runs.items()), file=sys.stderr)
        masks = mask_time(llama, kept)
        n_vocab = llama.model.n_vocab
    ratios = {engine: round(statistics.median(c / f for c, f in zip(runs[engine], runs["free"])), 3)
              for engine in ("gbnf", "llguidance")}
    return {"model": name, "n_vocab": n_vocab, "rounds": rounds, "tokens": tokens, "ratio_vs_free": ratios,
            "llguidance_mask": masks, "tokens_per_second": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma-3-270m"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "structured" /
                                         f"speed-{time.strftime('%Y-%m-%dT%H%M')}.json"))
    args = ap.parse_args()
    results = [bench_model(m, args.rounds, args.tokens, args.threads) for m in args.models]
    for r in results:
        print(f"{r['model']}: tokens/s vs free: gbnf {r['ratio_vs_free']['gbnf']}, llguidance "
              f"{r['ratio_vs_free']['llguidance']}; llguidance mask {r['llguidance_mask']['apply_us_median']} µs "
              f"apply + {r['llguidance_mask']['accept_us_median']} µs accept a token ({r['n_vocab']} tokens)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"saved {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
