#!/usr/bin/env python3
"""Two trees' `serve` on the drafting bench's chats (serving.py drafting), taking turns: B/A by round.

    .tox/py/bin/python bench/ab_drafting.py --a DIR_BEFORE --b DIR_AFTER [--rounds 4] [--set free] [--clients 8]

The dirs are bench/ab_engine.py's. Each round starts a fresh `llamaplug serve` of each tree (defaults: drafting
"auto"), sends the copy chats once (as the drafting bench does before the free ones), then times the chosen set at
`--clients`; rounds run A B, then B A. For a change to the engine, where llama-server's own round-to-round drift
would hide it in serving.py's ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import serving  # noqa: E402
from ab_engine import serve_tree, tree_options  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tree_options(ap)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--set", choices=("copy", "free"), default="free")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    model = serving.model_path(args.model)
    prompts = serving._copy_prompts() if args.set == "copy" else serving.FREE_PROMPTS
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    rates: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name in (["A", "B"] if r % 2 == 0 else ["B", "A"]):
            proc, port = serve_tree(trees[name], model, "-t", "2", "--parallel", str(args.clients), "-c",
                                    str(args.clients * 4096), "--metrics")
            try:
                asyncio.run(serving.drive_prompts(port, args.clients, serving._copy_prompts(), args.max_tokens))
                t0 = time.perf_counter()
                tokens, _ = asyncio.run(serving.drive_prompts(port, args.clients, prompts, args.max_tokens))
                rates[name].append(tokens / (time.perf_counter() - t0))
            finally:
                serving.stop(proc)
            print(f"round {r + 1} {name}: {rates[name][-1]:.1f} tokens/s", flush=True)
    ratios = [b / a for a, b in zip(rates["A"], rates["B"])]
    print("B/A by round " + ", ".join(f"{x:.3f}" for x in ratios) + f"; median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
