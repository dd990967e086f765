#!/usr/bin/env python3
"""Scale-out on Ray Serve (issue 22), as ratios measured in one run on this machine.

    .tox/py/bin/python bench/ray_serve.py [--clients 8] [--requests 200] [--rounds 3] [--quick]

throughput: SmolLM2 behind `llamaplug serve -t 1` (plain), then through Ray Serve's ingress
  with 1 replica and with 2 replicas (1 CPU each, so 1 thread each), every server with
  --clients slots per engine; the same openai.AsyncOpenAI driver as bench/serving.py
  (--clients concurrent clients, --requests streamed greedy completions of 32 tokens).
  Rounds interleave plain, 1 replica, 2 replicas. Targets: 2 replicas >= 1.7x 1 replica;
  the ingress's overhead at 1 replica (1 - ray1/plain) <= 10 %.
prefix: 4 prompt families x 8 requests (4 clients), cached/prompt tokens from the engines'
  own /metrics: one engine (plain), 2 replicas with prefix routing, 2 replicas round
  robin. Target: prefix >= 0.8x one engine's.
The Ray cluster is a local one started here (`ray.init(num_cpus=...)`, 1 CPU a replica
plus what the ingress needs: none). Results go to bench/results/serving/<host>-<stamp>-ray.json
(`--quick`: 1 round, 24 requests, a `-quick` suffix).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import socket
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import serving  # noqa: E402
from serving import OUT, PROMPTS, count_tokens, drive, free_port, model_path, start, stop  # noqa: E402

serving.THREADS = 1  # `llamaplug serve -t 1`: one replica's share

APP = "llamaplug-bench"


def metrics(port: int, replica: str | None = None) -> dict[str, float]:
    from llamaplug.integrations.ray import REPLICA_HEADER

    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={REPLICA_HEADER: replica} if replica
                                 else {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read().decode()
    return {k: float(v) for k, v in (line.split() for line in text.splitlines() if line and line[0] != "#")}


def post(port: int, body: dict) -> str | None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()
        return resp.headers.get("x-llamaplug-replica")


def families() -> list[str]:
    topics = ["the sea", "mountains", "old clocks", "bread"]
    pre = [f"Notes on {t}. " + " ".join(f"Fact {i} about {t} is worth knowing." for i in range(24)) for t in topics]
    return [f"{pre[f]} Question {q}: what is fact {q}?" for q in range(8) for f in range(4)]


def cache_ratio(port: int, replicas: list[str | None]) -> dict[str, float]:
    before = [metrics(port, r) for r in replicas]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: post(port, {"prompt": p, "max_tokens": 2}), families()))
    after = [metrics(port, r) for r in replicas]
    cached = sum(a["llamaplug_cached_tokens_total"] - b["llamaplug_cached_tokens_total"] for a, b in zip(after, before))
    prompt = sum(a["llamaplug_prompt_tokens_total"] - b["llamaplug_prompt_tokens_total"] for a, b in zip(after, before))
    return {"cached_tokens": cached, "prompt_tokens": prompt, "ratio": cached / prompt}


def replica_ids(port: int) -> list[str | None]:
    seen: set[str | None] = set()
    for i in range(32):
        seen.add(post(port, {"prompt": f"Replica probe {i}", "max_tokens": 1}))
        if len(seen) == 2:
            break
    return sorted(seen, key=str)


def deploy(model: Path, replicas: int, slots: int, per_slot: int, routing: str = "prefix") -> None:
    from ray import serve

    from llamaplug import LlamaParams
    from llamaplug.integrations.ray import build_app

    params = LlamaParams(model, n_ctx=slots * per_slot, n_seq_max=slots)
    serve.run(build_app(params, num_replicas=replicas, routing=routing), name=APP)


def measure(port: int, clients: int, requests: int, model: Path) -> dict[str, Any]:
    asyncio.run(drive(port, min(clients, 4), 8, prompts=PROMPTS[-8:]))  # warm-up
    run = asyncio.run(drive(port, clients, requests))
    tokens = count_tokens(run["texts"], model)
    return {"wall_s": run["wall_s"], "tokens": tokens, "tok_s": tokens / run["wall_s"], "errors": run["errors"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 round of 24 requests: proves the harness works")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.requests = 1, 24
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    model = model_path(args.model)
    port = free_port()
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, logging_level="warning")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    rounds: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            row: dict[str, Any] = {}
            proc, plain = start("llamaplug", model, args.clients, 256)
            try:
                row["plain"] = measure(plain, args.clients, args.requests, model)
            finally:
                stop(proc)
            for n in (1, 2):
                deploy(model, n, args.clients, 256)
                row[f"ray{n}"] = measure(port, args.clients, args.requests, model)
            rounds.append(row)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v['tok_s']:.1f} tok/s ({len(v['errors'])} errors)"
                                                  for k, v in row.items()), flush=True)
        prefix: dict[str, Any] = {}
        proc, plain = start("llamaplug", model, 4, 1024)
        try:
            prefix["one_engine"] = cache_ratio(plain, [None])
        finally:
            stop(proc)
        for routing in ("prefix", "round_robin"):
            deploy(model, 2, 4, 1024, routing)
            prefix[routing] = cache_ratio(port, replica_ids(port))
    finally:
        serve.shutdown()
        ray.shutdown()
    med = {k: statistics.median(r[k]["tok_s"] for r in rounds) for k in ("plain", "ray1", "ray2")}
    result = {"tok_s_median": med, "ray2_over_ray1": med["ray2"] / med["ray1"],
              "ingress_overhead": 1 - med["ray1"] / med["plain"],
              "prefix_over_one_engine": prefix["prefix"]["ratio"] / prefix["one_engine"]["ratio"],
              "round_robin_over_one_engine": prefix["round_robin"]["ratio"] / prefix["one_engine"]["ratio"],
              "rounds": rounds, "prefix": prefix}
    print(f"tok/s (median of {args.rounds}): plain {med['plain']:.1f}, 1 replica {med['ray1']:.1f}, "
          f"2 replicas {med['ray2']:.1f}")
    print(f"2 replicas / 1 replica: {result['ray2_over_ray1']:.2f}x (target >= 1.7); ingress overhead at 1 "
          f"replica: {result['ingress_overhead']:.1%} (target <= 10 %)")
    print("cached/prompt tokens: " + ", ".join(f"{k} {v['ratio']:.3f}" for k, v in prefix.items())
          + f"; prefix / one engine {result['prefix_over_one_engine']:.2f} (target >= 0.8)")
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y-%m-%dT%H%M")
    target = OUT / f"{socket.gethostname()}-{stamp}-ray{'-quick' if args.quick else ''}.json"
    target.write_text(json.dumps({"argv": sys.argv[1:], "cpu_count": os.cpu_count(), "time": time.time(),
                                  "result": result}, indent=1))
    print(f"results: {target}")


if __name__ == "__main__":
    main()
