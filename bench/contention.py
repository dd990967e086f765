#!/usr/bin/env python3
"""More decode threads than free cores (issue 35): `llamaplug run` against the pin's `llama-completion` on a busy
machine, each as a fresh process (load included), at -t 1 and -t 2, with `--hogs` busy-looping processes beside
them at the same priority (a 2-core machine with 2 hogs has no free core). Interleaved, ratios of medians.

    .tox/py/bin/python bench/contention.py [--hogs 2] [--rounds 3] [--tokens 8]

Results go to bench/results/contention/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from serving import model_path, native_bin  # noqa: E402

PROMPT = "The capital of France is"


def hog() -> None:
    while True:
        pass


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    model = model_path(args.model)
    native = native_bin() / "llama-completion"
    hogs = [multiprocessing.Process(target=hog, daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    runs: dict[str, list[float]] = {}
    try:
        for r in range(args.rounds):
            for threads in (1, 2):
                cmds = {f"native -t {threads}": [str(native), "-m", str(model), "-p", PROMPT, "-n", str(args.tokens),
                                                 "-t", str(threads), "--temp", "0", "-no-cnv", "-c", "512"],
                        f"llamaplug -t {threads}": [sys.executable, "-m", "llamaplug.cli", "run", "-m", str(model),
                                                    "-n", str(args.tokens), "-t", str(threads), "--temp", "0",
                                                    "-c", "512", "--no-timings", PROMPT]}
                order = list(cmds) if r % 2 == 0 else list(cmds)[::-1]  # ABBA
                for name in order:
                    runs.setdefault(name, []).append(timed(cmds[name]))
                    print(f"round {r}: {name}: {runs[name][-1]:.2f} s", flush=True)
    finally:
        for h in hogs:
            h.terminate()
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratios = {f"-t {t}": med[f"llamaplug -t {t}"] / med[f"native -t {t}"] for t in (1, 2)}
    for t in (1, 2):
        print(f"-t {t}: median native {med[f'native -t {t}']:.2f} s, llamaplug {med[f'llamaplug -t {t}']:.2f} s, "
              f"ours/native {ratios[f'-t {t}']:.2f}")
    out = HERE / "results" / "contention"
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{socket.gethostname()}-{dt.datetime.now():%Y-%m-%dT%H%M}.json"
    target.write_text(json.dumps({"argv": sys.argv[1:], "cpu_count": os.cpu_count(), "hogs": args.hogs,
                                  "seconds": runs, "median": med, "ours_over_native": ratios}, indent=1))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
