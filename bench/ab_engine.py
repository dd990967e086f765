#!/usr/bin/env python3
"""Two trees' Python package on the same native build: tg, batched and server throughput, interleaved.

    .tox/py/bin/python bench/ab_engine.py --a DIR_BEFORE --b DIR_AFTER [--rounds 4] [--model smollm2]

Each DIR holds a `llamaplug/` package: the installed package copied (its native files), then a tree's
Python files over it (`git archive <commit> core/src/llamaplug | tar -x --strip-components=2`), so the two
differ only in their Python. A change to the engine's Python is measured as B/A on this machine, in one run:

- tg: one sequence, `create_completion` of 128 tokens (greedy, end-of-generation tokens banned), tokens/s
  of the generation (timings.predicted_per_second), in a fresh process;
- batched: `create_completions` of 16 prompts x 64 tokens on 16 slots (as `serving.py engine`'s "together",
  prompts included), tokens/s of wall time, in a fresh process;
- server: `llamaplug serve` of each tree (both stay up and take turns), 8 clients sending 32 non-streamed
  greedy chat requests of 64 tokens (serving.py's drive_chat), completion tokens/s.

Rounds run A B, then B A (ABBA), so a slow spell of the shared machine weighs on both. Printed: each
round's values, the medians, and B/A as the median of the per-round ratios with their min and max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import serving  # noqa: E402

# The tree's package, not the env's: an editable install's finder would come before PYTHONPATH.
PRELUDE = "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in type(f).__module__]\n"

WORKER = PRELUDE + r"""
import json, time
import llamaplug as lp
assert lp.__file__.startswith(sys.argv[3]), lp.__file__
model, kind, n, threads = sys.argv[1], sys.argv[2], int(sys.argv[4]), int(sys.argv[5])
if kind == "tg":
    llama = lp.Llama.load(lp.LlamaParams(model, n_ctx=512, n_threads=threads, n_threads_batch=threads,
                                         cache_ram_mib=0))
else:
    llama = lp.Llama.load(lp.LlamaParams(model, n_ctx=16 * 128, n_seq_max=16, n_threads=threads,
                                         n_threads_batch=threads, n_batch=2048, cache_ram_mib=0))
banned = {t: float("-inf") for t in range(llama.model.n_vocab) if llama.model.token_is_eog(t)}
chain = lambda: lp.SamplerChain().logit_bias(banned).greedy()
if kind == "tg":
    llama.create_completion("1, 2, 3,", 8, sampler=chain())  # warm-up
    llama.context.kv_cache_clear()
    c = llama.create_completion("1, 2, 3, 4, 5, 6, 7, 8,", n, sampler=chain())
    assert len(c.tokens) == n
    value = c.timings.predicted_per_second
else:
    words = llama.tokenize(" ".join(f"item {i} of the list," for i in range(400)), False)
    prompts = [[llama.model.bos or 0, *words[i * 40:i * 40 + 31]] for i in range(16)]
    llama.create_completions(prompts[:2], 4, sampler=chain)  # warm-up
    llama.context.kv_cache_clear()
    t0 = time.perf_counter()
    out = llama.create_completions(prompts, n, sampler=chain)
    wall = time.perf_counter() - t0
    assert all(len(c.tokens) == n for c in out)
    value = 16 * n / wall
print(json.dumps(value))
"""


def in_process(tree: Path, model: Path, kind: str, n: int, threads: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", WORKER, str(model), kind, str(tree), str(n), str(threads)],
                         env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def serve_tree(tree: Path, model: Path, *flags: str) -> tuple[subprocess.Popen, int]:
    """`llamaplug serve -m model flags...` of the tree's package, up and answering: (process, port)."""
    port = serving.free_port()
    run_cli = PRELUDE + "import runpy; runpy.run_module('llamaplug.cli', run_name='__main__', alter_sys=True)"
    cmd = [sys.executable, "-c", run_cli, "serve", "-m", str(model), *flags, "--port", str(port)]
    return serving.launch(str(tree), cmd, port, env={**os.environ, "PYTHONPATH": str(tree)}), port


def tree_options(ap: argparse.ArgumentParser) -> None:
    """--a and --b: the two trees' package dirs (see the module)."""
    ap.add_argument("--a", required=True, type=Path, help="the 'before' tree's package dir")
    ap.add_argument("--b", required=True, type=Path, help="the 'after' tree's package dir")


def server(tree: Path, model: Path, threads: int) -> tuple[subprocess.Popen, int]:
    proc, port = serve_tree(tree, model, "-t", str(threads), "--parallel", "8", "-c", str(8 * 256))
    asyncio.run(serving.drive_chat(port, 8, 8))  # warm-up
    return proc, port


def chat(port: int, requests: int, max_tokens: int) -> float:
    got = asyncio.run(serving.drive_chat(port, 8, requests, max_tokens))
    if got["errors"]:
        raise SystemExit(f"server errors: {got['errors'][:3]}")
    return got["tokens"] / got["wall_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tree_options(ap)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tg-tokens", type=int, default=128)
    ap.add_argument("--batched-tokens", type=int, default=64, help="per sequence (16 of them)")
    ap.add_argument("--requests", type=int, default=32, help="chat requests per server run (8 clients)")
    ap.add_argument("--chat-tokens", type=int, default=64)
    args = ap.parse_args()
    model = serving.model_path(args.model)
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    servers = {name: server(tree, model, args.threads) for name, tree in trees.items()}
    sizes = {"tg": args.tg_tokens, "batched": args.batched_tokens}
    runs: dict[str, dict[str, list[float]]] = {k: {"A": [], "B": []} for k in ("tg", "batched", "server")}
    try:
        for r in range(args.rounds):
            order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
            for kind in runs:
                for name in order:
                    value = (chat(servers[name][1], args.requests, args.chat_tokens) if kind == "server" else
                             in_process(trees[name], model, kind, sizes[kind], args.threads))
                    runs[kind][name].append(value)
                print(f"round {r + 1} {kind}: A {runs[kind]['A'][-1]:.1f}  B {runs[kind]['B'][-1]:.1f} tok/s",
                      flush=True)
    finally:
        for proc, _ in servers.values():
            serving.stop(proc)
    summary = {}
    for kind, by in runs.items():
        ratios = [b / a for a, b in zip(by["A"], by["B"])]
        summary[kind] = {"A": by["A"], "B": by["B"], "ratio_median": statistics.median(ratios),
                         "ratio_min": min(ratios), "ratio_max": max(ratios)}
        print(f"{kind}: A {statistics.median(by['A']):.1f}, B {statistics.median(by['B']):.1f} tok/s (medians); "
              f"B/A {statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})")
    print(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": summary}))


if __name__ == "__main__":
    main()
