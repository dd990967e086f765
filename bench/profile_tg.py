#!/usr/bin/env python3
"""A steady generation loop to profile: create_completion of 128 greedy tokens, over and over.

    pip install py-spy    # anywhere; it is a standalone binary
    py-spy record --native -r 250 -o tg.svg -- .venv/bin/python bench/profile_tg.py --seconds 20

`--mid` profiles the mid-level loop (eval + sample + decode_single) instead.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import TG_TEXT  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="GGUF file (default: the catalog's smollm2-135m-instruct)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--mid", action="store_true", help="profile the mid-level loop instead")
    a = ap.parse_args()

    import llamaplug as lp
    from llamaplug.catalog import default_model

    model = a.model or default_model("smollm2-135m-instruct")
    llama = lp.Llama.load(lp.LlamaParams(model, n_ctx=2048, n_threads=a.threads, n_threads_batch=a.threads))
    prompt = llama.tokenize(TG_TEXT)
    ctx = llama.context
    done, t_end = 0, time.perf_counter() + a.seconds
    with lp.SamplerChain().greedy() as sampler:
        while time.perf_counter() < t_end:
            if a.mid:
                ctx.clear_cache()
                ctx.eval(prompt, 0)
                for _ in range(a.tokens):
                    ctx.decode_single(sampler.sample(ctx, -1))
                done += a.tokens
            else:
                done += llama.create_completion(prompt, max_tokens=a.tokens, sampler=sampler).timings.predicted_tokens
    print(f"{done} tokens in {a.seconds:.0f} s")


if __name__ == "__main__":
    main()
