#!/usr/bin/env python3
"""Time to first token after a restart with the prompt cache on disk (issue 46), against a cold read.

    .tox/py/bin/python bench/disk_cache.py [--model smollm2-135m-instruct] [--tokens 2000] [--threads N]
                                           [--ubatch N] [--exact]

Each run is a fresh process (a restart): a chat with a ~2,000-token system prompt and a question.
  cold:    no cache directory; the whole prompt is read.
  write:   a cache directory, empty; the same as cold, then a clean close writes the sequence.
  restart: the same directory, another question with the same system prompt: its prefix is loaded.
Printed: each run's time to first token (ms, the request's own: from submit to the first token), the
cached tokens, restart / cold, and whether restart's greedy reply equals a cold read of the same request
with the system prompt reused from a slot in one process (the same split of the prompt) and a whole read.
--exact: LlamaParams.cache_exact (a reused prefix ends on a multiple of n_ubatch, --ubatch).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap

CHILD = textwrap.dedent("""
    import json, sys, time
    import llamaplug as lp
    from llamaplug.catalog import default_model
    model, n_tokens, threads, cache_dir, question, warm_with, ubatch, exact = sys.argv[1:9]
    llm = lp.Llama.load(lp.LlamaParams(default_model(model), n_ctx=4096, n_threads=int(threads),
                                       cache_dir=cache_dir or None, n_ubatch=int(ubatch), cache_exact=exact == "1"))
    line = "Keep every answer short, exact and polite; cite the shelf a book is on. "
    system = ""
    while len(llm.model.tokenize(system)) < int(n_tokens):
        system += f"Rule {len(system) // len(line) + 1}: " + line
    def chat(q):
        t0 = time.perf_counter()
        first = None
        text = ""
        for chunk in llm.create_chat_completion([{"role": "system", "content": system},
                                                 {"role": "user", "content": q}],
                                                max_tokens=24, temperature=0, stream=True):
            delta = chunk.choices[0].delta.content or ""
            if first is None and delta:
                first = time.perf_counter() - t0
            text += delta
        return first, text
    if warm_with:
        chat(warm_with)
    ttft, text = chat(question)
    cached, n_system = llm.engine.stats.cached_tokens, len(llm.model.tokenize(system))
    llm.close()
    print("RESULT " + json.dumps({"ttft_ms": ttft * 1000, "text": text, "cached": cached, "n_system": n_system}))
""")


def run(args: argparse.Namespace, cache_dir: str, question: str, warm_with: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, args.model, str(args.tokens), str(args.threads), cache_dir,
                           question, warm_with, str(args.ubatch), "1" if args.exact else "0"],
                          capture_output=True, text=True, check=True)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[7:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ubatch", type=int, default=512, help="n_ubatch")
    p.add_argument("--exact", action="store_true", help="cache_exact: a reused prefix ends on a multiple of n_ubatch")
    args = p.parse_args()
    q1, q2 = "Which shelf holds the atlases?", "Say hello in French."
    with tempfile.TemporaryDirectory() as d:
        cold = run(args, "", q2)
        write = run(args, d, q1)
        restart = run(args, d, q2)
    warm = run(args, "", q2, warm_with=q1)
    print(json.dumps({"model": args.model, "n_ubatch": args.ubatch, "cache_exact": args.exact,
                      "system_tokens": cold["n_system"], "cold_ttft_ms": round(cold["ttft_ms"]),
                      "write_ttft_ms": round(write["ttft_ms"]), "restart_ttft_ms": round(restart["ttft_ms"]),
                      "restart_cached": restart["cached"],
                      "restart_over_cold": round(restart["ttft_ms"] / cold["ttft_ms"], 3),
                      "same_as_slot_reuse": restart["text"] == warm["text"],
                      "same_as_whole_read": restart["text"] == cold["text"]}, indent=1))


if __name__ == "__main__":
    main()
