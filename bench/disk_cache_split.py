#!/usr/bin/env python3
"""Where a reused prefix ends decides whether a reply equals a cold read's bit for bit (issue 46, CPU).

    .tox/py/bin/python bench/disk_cache_split.py [--model smollm2-135m-instruct] [--cuts 2016,2012,1536]

One Llama (no RAM tier, n_ubatch 512): a ~2,000-token prompt P read whole (cold); then P after a prompt sharing
its first tokens with it (the slot keeps them: the same split as a prefix loaded from disk), for the natural
shared prefix and for each cut in --cuts. Printed for each: the cached tokens, and whether the greedy tokens and
their logprobs (48 tokens, top 3) equal the cold read's.
"""

from __future__ import annotations

import argparse
import json

import llamaplug as lp
from llamaplug.catalog import default_model
from llamaplug.high.prefix_store import common_prefix

LINE = "Keep every answer short, exact and polite; cite the shelf a book is on. "


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--cuts", default="2016,2012,1536")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    llm = lp.Llama.load(lp.LlamaParams(default_model(a.model), n_ctx=4096, n_threads=a.threads, cache_ram_mib=0))
    system, i = "", 0
    while len(llm.tokenize(system)) < 2000:
        i += 1
        system += f"Rule {i}: " + LINE
    prompt = llm.tokenize(system + "\nQ: Where are the atlases kept?\nA:")
    other = llm.tokenize(system + "\nQ: Which shelf holds the atlases?\nA:")

    def run(tokens: list[int]) -> dict:
        c = llm.create_completion(tokens, max_tokens=48, logprobs=3)
        return {"cached": c.timings.cached_tokens, "tokens": c.tokens, "logprobs": repr(c.logprobs),
                "first_logprob": c.logprobs[0].logprob}

    cold = run(prompt)
    runs = {}
    run(other)
    runs[f"natural ({common_prefix(prompt, other)} shared)"] = run(prompt)
    for cut in (int(x) for x in a.cuts.split(",")):
        run(prompt[:cut] + llm.tokenize(" Hello there friend", False))
        runs[f"cut {cut}"] = run(prompt)
    llm.close()
    print(json.dumps({"model": a.model, "prompt_tokens": len(prompt), "n_ubatch": 512,
                      "cold_first_logprob": cold["first_logprob"],
                      "runs": {k: {"cached": v["cached"], "same_tokens": v["tokens"] == cold["tokens"],
                                   "same_logprobs": v["logprobs"] == cold["logprobs"],
                                   "first_logprob": v["first_logprob"]} for k, v in runs.items()}}, indent=1))


if __name__ == "__main__":
    main()
