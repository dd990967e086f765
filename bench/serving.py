#!/usr/bin/env python3
"""Serving benchmarks, as ratios measured in one run on this machine.

    .tox/py/bin/python bench/serving.py engine [--models smollm2,gemma] [--rounds 3]
    .tox/py/bin/python bench/serving.py load [--clients 8,32] [--requests 200] [--unique]
    .tox/py/bin/python bench/serving.py chat [--clients 8,32] [--requests 96] [--rounds 2] [--restart]
    .tox/py/bin/python bench/serving.py cold [--model smollm2] [--clients 8] [--requests 64] [--rounds 2]
    .tox/py/bin/python bench/serving.py disconnects [--requests 1000]
    .tox/py/bin/python bench/serving.py drafting [--model smollm2] [--clients 1,8] [--max-tokens 256] [--rounds 2]

engine: `create_completions` of 16 prompts x 64 tokens against the same prompts one
  by one (one Llama, 2 threads), beside the pinned llama-batched-bench's ratio of its
  B=16 to B=1 throughput on the same sizes (-npp 32 -ntg 64, prompts included, so
  both ratios are wall time of 16 alone / wall time of 16 together). Target: ours
  >= 0.95x native's. Rounds interleave native and llamaplug.
load: the pinned llama-server, `llamaplug serve` and llama-cpp-python's server (its
  [server] extra, in bench/peer_env.py's venv) on the same model, threads and slots,
  driven by the same openai.AsyncOpenAI client: N concurrent clients, R streamed
  completions per run (greedy, 32 tokens). Throughput counts the tokens of the text
  received (tokenized by llamaplug, so the same measure for all three), time to
  first token p50/p95, errors, and prompt tokens decoded vs reused (each server's
  /metrics). The default prompts repeat (59 of them), which both servers' host-memory
  prompt caches serve; --unique gives every request its own prompt.
chat: the throughput target of issue 24: the pinned llama-server, `llamaplug serve` and `llamaplug serve
  --models-dir` (the router, one model in the dir, loaded by the first request) on the same model, threads
  and slots, N clients each sending non-streamed greedy chat requests of 64 tokens; runs in ABBA order
  (native, ours, router, router, ours, native, ...) so drift weighs on all of them. The three servers
  stay up side by side and take turns (--restart: each is started anew for each run, the first method).
  Throughput counts each server's own usage.completion_tokens. Target: ours >= 1.0x native at 8 and 32 clients.
cold: a fresh server for each run, ours and the pin's llama-server in ABBA order: seconds from the spawn to
  /health ready, the latency of each of the first 64 chat requests (8 clients, greedy, 64 tokens) by waves of 8,
  their tokens/s, and the resident memory at ready and after them. Targets (issue 31): ready within 2x, RSS at
  most 64 MiB above, tokens/s >= 1.0x.
drafting (issue 45): fresh servers in ABBA order, `llamaplug serve` with its defaults (drafting on) against the
  pin's llama-server with its defaults (off) and with --spec-type ngram-mod, on copy-heavy chats (code edits, quoting
  a document, rewriting JSON) and free ones (stories, questions), at 1 and 8 clients (--clients): greedy chat
  requests of --max-tokens, tokens/s from each server's usage. Targets: copy >= 1.8x llama-server's default and
  >= 1.0x its ngram-mod; free >= 0.98x its default.
disconnects: R streamed requests to `llamaplug serve`, each dropped after a random
  number of events; afterwards /metrics must show every slot free, and the server's
  RSS is sampled (flat: the last sample within 5% of the one after warm-up).
Results go to bench/results/serving/.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "vendor" / "llama.cpp"))
OUT = HERE / "results" / "serving"
THREADS = 2

N_SEQ, NPP, NTG = 16, 32, 64


def model_path(name: str) -> Path:
    from llamaplug.catalog import entries

    for entry in entries():
        if entry.name.startswith(name) and entry.locate():
            return Path(entry.locate())
    raise SystemExit(f"model {name!r} is not installed (see `llamaplug info`)")


def native_bin() -> Path:
    import native_tools

    return Path(native_tools.build())


# -- engine -----------------------------------------------------------------
def native_ratio(bin_dir: Path, model: Path) -> dict[str, float]:
    out = subprocess.run([str(bin_dir / "llama-batched-bench"), "-m", str(model), "-t", str(THREADS), "-c",
                          str(N_SEQ * (NPP + NTG) + 64), "-npp", str(NPP), "-ntg", str(NTG), "-npl", f"1,{N_SEQ}",
                          "--output-format", "jsonl"], capture_output=True, text=True, check=True)
    rows = {r["pl"]: r for r in (json.loads(line) for line in out.stdout.splitlines() if line.startswith("{"))}
    one, many = rows[1], rows[N_SEQ]
    t1, tn = one["t_pp"] + one["t_tg"], many["t_pp"] + many["t_tg"]
    return {"ratio": N_SEQ * t1 / tn, "tg_ratio": (N_SEQ * NTG / many["t_tg"]) / (NTG / one["t_tg"]),
            "b1_s": t1, "b16_s": tn}


def ours_ratio(llama: Any, prompts: list[list[int]]) -> dict[str, float]:
    import llamaplug as lp

    banned = {t: float("-inf") for t in range(llama.model.n_vocab) if llama.model.token_is_eog(t)}

    def chain() -> lp.SamplerChain:  # greedy that never ends early, as batched-bench's fixed -ntg
        return lp.SamplerChain().logit_bias(banned).greedy()

    def fresh(prompt: list[int]) -> lp.Completion:
        llama.context.kv_cache_clear()  # llama-batched-bench decodes every prompt: no slot reuses a prefix
        return llama.create_completion(prompt, NTG, sampler=chain())

    t0 = time.perf_counter()
    alone = [fresh(p) for p in prompts]
    t1 = time.perf_counter()
    llama.context.kv_cache_clear()
    together = llama.create_completions(prompts, NTG, sampler=chain)
    t2 = time.perf_counter()
    assert all(len(c.tokens) == NTG for c in alone + together)
    cached = [c.timings.cached_tokens for c in alone + together]
    if any(cached):  # cached work counted as fresh would inflate the ratio (issue 36 B1)
        raise RuntimeError(f"prompts reused cached tokens: {cached}")
    # Equal on SmolLM2 (Q4_1); on Gemma-3 (Q4_K) the CPU backend's batched matmul sums in another
    # order than its one-row path, so a greedy text can part ways after some tokens: counted, not asserted.
    same = sum(a.text == b.text for a, b in zip(alone, together)) / N_SEQ
    return {"ratio": (t1 - t0) / (t2 - t1), "b1_s": (t1 - t0) / N_SEQ, "b16_s": t2 - t1, "same_text": same,
            "cached_tokens": sum(cached)}


def bench_engine(args: argparse.Namespace) -> dict[str, Any]:
    import llamaplug as lp

    bin_dir = native_bin()
    results: dict[str, Any] = {}
    for name in args.models.split(","):
        path = model_path(name)
        rounds = []
        with lp.Llama.load(lp.LlamaParams(path, n_ctx=N_SEQ * (NPP + NTG) + 64, n_seq_max=N_SEQ,
                                          n_threads=THREADS, n_batch=2048, cache_ram_mib=0)) as llama:
            words = llama.tokenize(open(ROOT / "README.md", encoding="utf-8").read(), False)
            prompts = [[llama.model.bos or 0, *words[i * 50:i * 50 + NPP - 1]] for i in range(N_SEQ)]
            ours_ratio(llama, prompts[:2])  # warm-up
            for r in range(args.rounds):
                n = native_ratio(bin_dir, path)
                o = ours_ratio(llama, prompts)
                rounds.append({"native": n, "llamaplug": o})
                print(f"{name} round {r + 1}: native B16/B1 {n['ratio']:.2f} (tg only {n['tg_ratio']:.2f}), "
                      f"llamaplug {o['ratio']:.2f} (same text as alone: {o['same_text']:.0%})", flush=True)
        nat = statistics.median(r["native"]["ratio"] for r in rounds)
        ours = statistics.median(r["llamaplug"]["ratio"] for r in rounds)
        results[name] = {"rounds": rounds, "native_ratio": nat, "llamaplug_ratio": ours,
                         "ours_over_native": ours / nat}
        print(f"{name}: llamaplug {ours:.2f}x / native {nat:.2f}x = {ours / nat:.3f} (target >= 0.95)")
    return results


# -- servers ----------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(kind: str, model: Path, slots: int, per_slot: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    if kind == "router":  # llamaplug serve over a models dir holding only `model`: the registry in front
        folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"llamaplug-bench-models-{os.getpid()}"
        folder.mkdir(exist_ok=True)
        link = folder / model.name
        if not link.exists():
            link.symlink_to(model)
        cmd = [sys.executable, "-m", "llamaplug.cli", "serve", "--models-dir", str(folder), "-t", str(THREADS),
               "--parallel", str(slots), "-c", str(slots * per_slot), "--port", str(port), "--metrics"]
    elif kind == "native":
        cmd = [str(native_bin() / "llama-server"), "-m", str(model), "-t", str(THREADS), "-np", str(slots),
               "-c", str(slots * per_slot), "--host", "127.0.0.1", "--port", str(port), "--metrics"]
    elif kind in ("llamaplug", "before"):
        cmd = [sys.executable, "-m", "llamaplug.cli", "serve", "-m", str(model), "-t", str(THREADS), "--parallel",
               str(slots), "-c", str(slots * per_slot), "--port", str(port), "--metrics"]
        if kind == "before":  # an earlier tree's Python package over this build's native part (--before)
            return launch(kind, cmd, port, env={**os.environ, "PYTHONPATH": os.environ["BENCH_BEFORE"]}), port
    else:
        import peer_env

        cmd = [str(peer_env.python()), "-m", "llama_cpp.server", "--model", str(model), "--n_threads", str(THREADS),
               "--n_ctx", str(per_slot), "--host", "127.0.0.1", "--port", str(port),
               # Its default lets each new request interrupt the running stream (so every client got
               # about one token): off, it serves them one after another as designed.
               "--interrupt_requests", "False"]
    return launch(kind, cmd, port), port


def launch(kind: str, cmd: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Run the server `cmd` and wait until it answers on `port` (its /v1/models)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"{kind} server exited: {' '.join(cmd)}") from None
            time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"{kind} server did not start")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


PROMPTS = [f"Count from {i} to {i + 100}, separated by commas: {i}," for i in range(1, 60)]


async def _client(port: int, requests: int) -> tuple[Any, str, asyncio.Queue[int]]:
    """An openai.AsyncOpenAI on the server at `port`, its (first) model, and a queue of request numbers."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0,
                                timeout=600)
    model = (await client.models.list()).data[0].id
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    return client, model, queue


async def drive(port: int, clients: int, requests: int, max_tokens: int = 32, drop: bool = False,
                prompts: list[str] = PROMPTS) -> dict[str, Any]:
    client, model, queue = await _client(port, requests)
    texts: list[str] = []
    ttft: list[float] = []
    errors: list[str] = []
    rng = random.Random(0)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            t0 = time.perf_counter()
            first, parts = None, []
            cut = rng.randint(1, 12) if drop else None
            try:
                stream = await client.completions.create(model=model, prompt=prompts[i % len(prompts)],
                                                         max_tokens=max_tokens, temperature=0, stream=True)
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].text:
                        if first is None:
                            first = time.perf_counter() - t0
                        parts.append(chunk.choices[0].text)
                        if cut is not None and len(parts) >= cut:
                            await stream.close()  # the client goes away mid-stream
                            break
            except Exception as exc:  # every failure is counted, none stops the run
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            if first is not None:
                ttft.append(first)
            texts.append("".join(parts))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - t0
    await client.close()
    return {"wall_s": wall, "texts": texts, "ttft": ttft, "errors": errors}


CHAT_PROMPTS = [f"Write a short story about a {animal} who learns to {skill}." for animal, skill in
                [("cat", "swim"), ("dog", "paint"), ("fox", "sing"), ("owl", "cook"), ("bear", "dance"),
                 ("mouse", "fly"), ("horse", "read"), ("frog", "juggle")]]


async def drive_chat(port: int, clients: int, requests: int, max_tokens: int = 64) -> dict[str, Any]:
    """`requests` non-streamed greedy chat requests from `clients` concurrent clients."""
    client, model, queue = await _client(port, requests)
    tokens, errors = 0, []

    async def worker() -> None:
        nonlocal tokens
        while not queue.empty():
            i = queue.get_nowait()
            try:
                out = await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": CHAT_PROMPTS[i % len(CHAT_PROMPTS)]}],
                    max_tokens=max_tokens, temperature=0)
                tokens += out.usage.completion_tokens
            except Exception as exc:  # every failure is counted, none stops the run
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - t0
    await client.close()
    return {"wall_s": wall, "tokens": tokens, "errors": errors}


def _chat_turns(kinds: list[str], model: Path, clients: int, rounds: int,
                restart: bool) -> Iterator[tuple[int, str, int]]:
    """(round, server kind, its port) for each run in ABBA order, the server warmed up (the router's model loaded).

    All servers stay up (an idle one sleeps) and take turns, so the machine's drift, which here lasts longer
    than one run, falls on all of them alike; `restart`: each run gets a server started for it (the first method).
    """
    servers: dict[str, tuple[subprocess.Popen, int]] = {}

    def up(kind: str) -> None:
        servers[kind] = start(kind, model, clients, 256)
        asyncio.run(drive_chat(servers[kind][1], clients, clients))  # warm-up

    try:
        if not restart:
            for kind in kinds:
                up(kind)
        for r in range(rounds):
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):  # ABBA
                if restart:
                    up(kind)
                yield r, kind, servers[kind][1]
                if restart:
                    stop(servers.pop(kind)[0])
    finally:
        for proc, _ in servers.values():
            stop(proc)


def bench_chat(args: argparse.Namespace) -> dict[str, Any]:
    model = model_path(args.model)
    kinds = ["native", "llamaplug", "router"] + (["before"] if args.before else [])
    if args.before:
        os.environ["BENCH_BEFORE"] = str(Path(args.before).resolve())
    results: dict[str, Any] = {"method": "restart" if args.restart else "alternate", "before": args.before}
    for clients in map(int, args.clients.split(",")):
        runs: dict[str, list[float]] = {k: [] for k in kinds}
        errors = dict.fromkeys(kinds, 0)
        for r, kind, port in _chat_turns(kinds, model, clients, args.rounds, args.restart):
            run = asyncio.run(drive_chat(port, clients, args.requests))
            runs[kind].append(run["tokens"] / run["wall_s"])
            errors[kind] += len(run["errors"])
            print(f"{clients} clients, round {r}, {kind:9}: {runs[kind][-1]:.1f} tok/s, "
                  f"errors {len(run['errors'])} {run['errors'][:1]}", flush=True)
        med = {k: statistics.median(v) for k, v in runs.items()}
        per_round = [o / n for o, n in zip(runs["llamaplug"], runs["native"], strict=True)]
        row = {"tokens_per_s": runs, "median": med, "errors": errors,
               "ours_over_native": med["llamaplug"] / med["native"],
               "router_over_native": med["router"] / med["native"],
               "per_round_ours_over_native": per_round,
               "per_round_router_over_native": [o / n for o, n in zip(runs["router"], runs["native"], strict=True)]}
        print(f"{clients} clients: medians native {med['native']:.1f}, ours {med['llamaplug']:.1f}, router "
              f"{med['router']:.1f} tok/s; ours/native {row['ours_over_native']:.3f}, router/native "
              f"{row['router_over_native']:.3f}, median of the rounds' ours/native "
              f"{statistics.median(per_round):.3f} (target >= 1.0)", flush=True)
        if args.before:
            row["ours_over_before"] = med["llamaplug"] / med["before"]
            row["per_round_ours_over_before"] = [o / b for o, b in zip(runs["llamaplug"], runs["before"],
                                                                       strict=True)]
            print(f"{clients} clients: before {med['before']:.1f} tok/s; ours/before {row['ours_over_before']:.3f}, "
                  f"median of the rounds' {statistics.median(row['per_round_ours_over_before']):.3f}", flush=True)
        results[f"clients={clients}"] = row
    return results


def count_tokens(texts: list[str], model: Path) -> int:
    import llamaplug as lp

    lp.LlamaBackend.init()
    vocab = lp.LlamaModel(model, lp.ModelParams(vocab_only=True))
    try:
        return sum(len(vocab.tokenize(t, False)) for t in texts)
    finally:
        vocab.close()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_load(args: argparse.Namespace) -> dict[str, Any]:
    import peer_env

    model = model_path(args.model)
    kinds = ["native", "llamaplug"] + (["peer"] if peer_env.python().exists() else [])
    if "peer" not in kinds:
        print("llama-cpp-python's venv is missing (python bench/peer_env.py builds it): peer skipped")
    results: dict[str, Any] = {}
    for clients in map(int, args.clients.split(",")):
        row = {}
        for kind in kinds:
            proc, port = start(kind, model, clients, 256)
            # --unique: no prompt comes twice, so no server reuses more than a shared start
            prompts = [f"Count from {i} to {i + 100}, separated by commas: {i},"
                       for i in range(1000, 1008 + args.requests)] if args.unique else PROMPTS
            try:
                asyncio.run(drive(port, min(clients, 4), 8, prompts=prompts[-8:]))  # warm-up
                run = asyncio.run(drive(port, clients, args.requests, prompts=prompts))
                reuse = prompt_reuse(kind, port)
            finally:
                stop(proc)
            tokens = count_tokens(run["texts"], model)
            row[kind] = {"tokens_per_s": tokens / run["wall_s"], "ttft_p50_ms": pct(run["ttft"], 0.5) * 1e3,
                         "ttft_p95_ms": pct(run["ttft"], 0.95) * 1e3, "errors": len(run["errors"]),
                         "error_samples": run["errors"][:3], "requests": args.requests, "tokens": tokens,
                         "wall_s": run["wall_s"], **reuse}
            r = row[kind]
            print(f"{clients} clients, {kind:9}: {r['tokens_per_s']:.1f} tok/s, ttft p50 {r['ttft_p50_ms']:.0f} ms "
                  f"p95 {r['ttft_p95_ms']:.0f} ms, errors {r['errors']}", flush=True)
        ours = row["llamaplug"]["tokens_per_s"]
        row["ours_over_native"] = ours / row["native"]["tokens_per_s"]
        if "peer" in row:
            row["ours_over_peer"] = ours / row["peer"]["tokens_per_s"]
        print(f"{clients} clients: llamaplug/native {row['ours_over_native']:.2f} (target >= 0.9)"
              + (f", llamaplug/peer {row['ours_over_peer']:.2f} (target >= 3)" if "peer" in row else ""))
        results[f"clients={clients}"] = row
    return results


def prompt_reuse(kind: str, port: int) -> dict[str, Any]:
    """Prompt tokens decoded and reused from a cache, from the server's own /metrics (not the peer's)."""
    names = {"native": ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"),
             "llamaplug": ("llamaplug_prompt_tokens_total", "llamaplug_cached_tokens_total")}.get(kind)
    if names is None:
        return {}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        values = dict(line.split(" ", 1) for line in r.read().decode().splitlines() if line and line[0] != "#")
    total, cached = (float(values[n]) for n in names)
    if kind == "llamaplug":
        total -= cached  # ours counts every prompt token, llama-server the ones it decoded
    return {"prompt_tokens_decoded": int(total), "prompt_tokens_reused": int(cached)}


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(re.search(r"VmRSS:\s+(\d+)", fh.read()).group(1))


def bench_disconnects(args: argparse.Namespace) -> dict[str, Any]:
    model = model_path(args.model)
    proc, port = start("llamaplug", model, 8, 512)
    samples = []
    try:
        asyncio.run(drive(port, 8, 40, 64))  # warm-up: every slot used once
        samples.append(rss_kib(proc.pid))
        done = 0
        while done < args.requests:
            n = min(100, args.requests - done)
            run = asyncio.run(drive(port, 16, n, 200, drop=True))
            done += n
            samples.append(rss_kib(proc.pid))
            if run["errors"]:
                print("errors:", run["errors"][:3])
        time.sleep(1.0)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            metrics = dict(line.split() for line in resp.read().decode().splitlines() if line and line[0] != "#")
    finally:
        stop(proc)
    out = {"requests": args.requests, "slots_busy_after": float(metrics["llamaplug_slots_busy"]),
           "queue_after": float(metrics["llamaplug_queue_length"]), "rss_kib": samples,
           "rss_growth_after_warmup": samples[-1] / samples[0] - 1,
           "finished": float(metrics["llamaplug_finished_total"]), "errors": float(metrics["llamaplug_errors_total"])}
    print(f"{args.requests} dropped streams: slots busy after {out['slots_busy_after']:.0f}, queue "
          f"{out['queue_after']:.0f}, RSS {samples[0] / 1024:.0f} -> {samples[-1] / 1024:.0f} MiB "
          f"({out['rss_growth_after_warmup']:+.1%})")
    return out


# -- cold ---------------------------------------------------------------------------------------------------------
def launch_timed(kind: str, model: Path, slots: int, per_slot: int) -> tuple[subprocess.Popen, int, float]:
    """Start a server as `start` does, and the seconds from its spawn to its first /health 200 (ready)."""
    port = free_port()
    if kind == "native":
        cmd = [str(native_bin() / "llama-server"), "-m", str(model), "-t", str(THREADS), "-np", str(slots),
               "-c", str(slots * per_slot), "--host", "127.0.0.1", "--port", str(port)]
    else:
        cmd = [sys.executable, "-m", "llamaplug.cli", "serve", "-m", str(model), "-t", str(THREADS), "--parallel",
               str(slots), "-c", str(slots * per_slot), "--port", str(port), "--metrics"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port, time.perf_counter() - t0
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"{kind} server exited: {' '.join(cmd)}") from None
        time.sleep(0.01)
    proc.kill()
    raise SystemExit(f"{kind} server did not start")


async def drive_chat_timed(port: int, clients: int, requests: int, max_tokens: int = 64) -> list[tuple[float, int]]:
    """As drive_chat, each request's (seconds, completion tokens) in the order the requests were sent."""
    client, model, queue = await _client(port, requests)
    out: list[tuple[float, int]] = [(0.0, 0)] * requests

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            t0 = time.perf_counter()
            got = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": CHAT_PROMPTS[i % len(CHAT_PROMPTS)]}],
                max_tokens=max_tokens, temperature=0)
            out[i] = (time.perf_counter() - t0, got.usage.completion_tokens)

    await asyncio.gather(*(worker() for _ in range(clients)))
    await client.close()
    return out


def bench_cold(args: argparse.Namespace) -> dict[str, Any]:
    """A fresh server each run (ABBA, ours against the pin's llama-server): seconds to /health ready, each of the
    first `requests` chat requests' latency, and the resident memory after them."""
    model = model_path(args.model)
    kinds = ["native", "llamaplug"]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):
            proc, port, ready = launch_timed(kind, model, args.clients, args.per_slot)
            try:
                rss_ready = rss_kib(proc.pid)
                t0 = time.perf_counter()
                per = asyncio.run(drive_chat_timed(port, args.clients, args.requests))
                wall = time.perf_counter() - t0
                rss = rss_kib(proc.pid)
            finally:
                stop(proc)
            tokens = sum(n for _, n in per)
            runs[kind].append({"ready_s": ready, "rss_ready_kib": rss_ready, "rss_after_kib": rss, "wall_s": wall,
                               "tokens": tokens, "latency_s": [s for s, _ in per]})
            print(f"round {r}, {kind:9}: ready {ready:.2f} s, {tokens / wall:.1f} tok/s over the first "
                  f"{args.requests}, first request {per[0][0]:.3f} s, RSS {rss_ready / 1024:.0f} -> "
                  f"{rss / 1024:.0f} MiB",
                  flush=True)
    med = {k: {key: statistics.median(run[key] for run in v) for key in ("ready_s", "rss_ready_kib", "rss_after_kib")}
           for k, v in runs.items()}
    for k, v in runs.items():
        med[k]["tokens_per_s"] = statistics.median(run["tokens"] / run["wall_s"] for run in v)
        # each request's median latency over the runs, then by groups of `clients` (one wave of requests)
        lat = [statistics.median(run["latency_s"][i] for run in v) for i in range(args.requests)]
        med[k]["wave_latency_s"] = [statistics.mean(lat[i:i + args.clients]) for i in range(0, args.requests,
                                                                                               args.clients)]
    ours, native = med["llamaplug"], med["native"]
    result = {"model": model.name, "clients": args.clients, "requests": args.requests, "runs": runs, "median": med,
              "tokens_per_s_ours_over_native": ours["tokens_per_s"] / native["tokens_per_s"],
              "ready_ours_over_native": ours["ready_s"] / native["ready_s"],
              "rss_after_ours_minus_native_mib": (ours["rss_after_kib"] - native["rss_after_kib"]) / 1024,
              "wave_latency_ours_over_native": [o / n for o, n in zip(ours["wave_latency_s"],
                                                                      native["wave_latency_s"], strict=True)]}
    print(f"{model.name}, {args.clients} clients, the first {args.requests} requests of a fresh server: ours/native "
          f"{result['tokens_per_s_ours_over_native']:.3f} tok/s; ready {ours['ready_s']:.2f} vs "
          f"{native['ready_s']:.2f} s ({result['ready_ours_over_native']:.2f}x, target <= 2); RSS after "
          f"{ours['rss_after_kib'] / 1024:.0f} vs {native['rss_after_kib'] / 1024:.0f} MiB "
          f"({result['rss_after_ours_minus_native_mib']:+.0f}, target <= +64); latency per wave ours/native "
          + " ".join(f"{x:.2f}" for x in result["wave_latency_ours_over_native"]), flush=True)
    return result


# -- drafting (issue 45) ---------------------------------------------------------------------------------------------
def _copy_prompts() -> list[str]:
    """Chats whose replies copy what they were given: code edits, quoting a document, rewriting JSON."""
    code = (ROOT / "core" / "src" / "llamaplug" / "high" / "scheduler.py").read_text(encoding="utf-8")
    starts = (code.index("def schedule("), code.index("def _plan_drafts("))
    funcs = [code[i:code.find("\n\n\n", i) if "\n\n\n" in code[i:] else len(code)] for i in starts]
    doc = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    para = [p for p in doc.split("\n\n") if len(p) > 600][:3]
    record = {"id": 17, "name": "Ada Lovelace", "born": 1815, "fields": ["mathematics", "computing"],
              "notes": "wrote the first published algorithm for Babbage's Analytical Engine"}
    return ([f"Rename the variable `plan` to `step` in this function and give back the whole function:\n\n{f}"
             for f in funcs]
            + [f"Quote this paragraph word for word, then say in one sentence what it means:\n\n{p}" for p in para]
            + [f"Rewrite this JSON with the key `born` renamed to `birth_year`, every other field as it is:\n\n"
               f"{json.dumps(record, indent=2)}"])


FREE_PROMPTS = CHAT_PROMPTS + ["What is the capital of Australia, and why was it chosen?",
                               "Explain in a few sentences how a refrigerator works."]
DRAFTING_SERVERS = {"native": [], "native-ngram-mod": ["--spec-type", "ngram-mod"], "llamaplug": []}


async def drive_prompts(port: int, clients: int, prompts: list[str],
                        max_tokens: int) -> tuple[int, list[float]]:
    """Each prompt once as a greedy chat request, `clients` at a time: the completion tokens (the server's usage) and
    each reply's generation speed (its `timings.predicted_per_second`, prompt reading left out)."""
    client, model, queue = await _client(port, len(prompts))
    total, speeds = 0, []

    async def worker() -> None:
        nonlocal total
        while not queue.empty():
            i = queue.get_nowait()
            got = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompts[i]}],
                                                       max_tokens=max_tokens, temperature=0)
            total += got.usage.completion_tokens
            speeds.append(float((got.model_extra or {}).get("timings", {}).get("predicted_per_second", 0.0)))

    await asyncio.gather(*(worker() for _ in range(clients)))
    await client.close()
    return total, speeds


def bench_drafting(args: argparse.Namespace) -> dict[str, Any]:
    """Fresh servers, ABBA order: llamaplug serve's defaults (drafting on) against llama-server's (drafting off) and
    llama-server --spec-type ngram-mod, on copy-heavy and free chats, at each client count: tokens/s ratios."""
    model = model_path(args.model)
    sets = {"copy": _copy_prompts(), "free": FREE_PROMPTS}
    kinds = list(DRAFTING_SERVERS)
    runs: dict[str, Any] = {}
    # the same runs read as llama-server's timings do: generation alone, without reading the (long) copy prompts
    gen: dict[str, Any] = {}
    for clients in (int(c) for c in args.clients.split(",")):
        for r in range(args.rounds):
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                port = free_port()
                if kind == "llamaplug":
                    cmd = [sys.executable, "-m", "llamaplug.cli", "serve", "-m", str(model), "-t", str(THREADS),
                           "--parallel", str(clients), "-c", str(clients * args.per_slot), "--port", str(port),
                           "--metrics"]
                else:
                    cmd = [str(native_bin() / "llama-server"), "-m", str(model), "-t", str(THREADS), "-np",
                           str(clients), "-c", str(clients * args.per_slot), "--host", "127.0.0.1", "--port",
                           str(port), *DRAFTING_SERVERS[kind]]
                proc = launch(kind, cmd, port)
                try:
                    for name, prompts in sets.items():
                        t0 = time.perf_counter()
                        tokens, speeds = asyncio.run(drive_prompts(port, clients, prompts, args.max_tokens))
                        wall = time.perf_counter() - t0
                        runs.setdefault(f"{name}/{clients}", {}).setdefault(kind, []).append(tokens / wall)
                        gen.setdefault(f"{name}/{clients}", {}).setdefault(kind, []).append(statistics.mean(speeds))
                        print(f"{clients} clients, round {r}, {kind:16} {name}: {tokens / wall:.2f} tok/s "
                              f"(generation {statistics.mean(speeds):.2f} tok/s a reply)", flush=True)
                finally:
                    stop(proc)
    ratios, gen_ratios = _drafting_ratios(runs, "wall"), _drafting_ratios(gen, "generation")
    return {"model": model.name, "max_tokens": args.max_tokens, "runs": runs, "ratios": ratios,
            "generation_runs": gen, "generation_ratios": gen_ratios}


def _drafting_ratios(runs: dict[str, Any], label: str) -> dict[str, Any]:
    ratios = {}
    for key, by_kind in runs.items():
        med = {k: statistics.median(v) for k, v in by_kind.items()}
        ratios[key] = {"ours_over_native": med["llamaplug"] / med["native"],
                       "ours_over_native_ngram_mod": med["llamaplug"] / med["native-ngram-mod"],
                       "native_ngram_mod_over_native": med["native-ngram-mod"] / med["native"]}
        print(f"{key} ({label}): ours/llama-server {ratios[key]['ours_over_native']:.2f}x, ours/llama-server "
              f"ngram-mod {ratios[key]['ours_over_native_ngram_mod']:.2f}x (ngram-mod/default "
              f"{ratios[key]['native_ngram_mod_over_native']:.2f}x)", flush=True)
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    e = sub.add_parser("engine")
    e.add_argument("--models", default="smollm2")
    e.add_argument("--rounds", type=int, default=3)
    ld = sub.add_parser("load")
    ld.add_argument("--model", default="smollm2")
    ld.add_argument("--clients", default="8,32")
    ld.add_argument("--requests", type=int, default=200)
    ld.add_argument("--unique", action="store_true", help="no prompt twice in a run (the default repeats 59)")
    c = sub.add_parser("chat")
    c.add_argument("--model", default="smollm2")
    c.add_argument("--clients", default="8,32")
    c.add_argument("--requests", type=int, default=96)
    c.add_argument("--rounds", type=int, default=2, help="each round runs every server once; odd rounds reversed")
    c.add_argument("--before", metavar="DIR", help="also serve an earlier tree's llamaplug package (DIR holds "
                   "its llamaplug/ over this build's native files) in the rotation: ours/before is the change's cost")
    c.add_argument("--restart", action="store_true",
                   help="start each server anew for every run (the first method) instead of keeping all three up")
    k = sub.add_parser("cold")
    k.add_argument("--model", default="smollm2")
    k.add_argument("--clients", type=int, default=8)
    k.add_argument("--requests", type=int, default=64)
    k.add_argument("--per-slot", type=int, default=1024, help="context per slot (-c is clients x this)")
    k.add_argument("--rounds", type=int, default=2, help="each round starts each server once; odd rounds reversed")
    sp = sub.add_parser("drafting")
    sp.add_argument("--model", default="smollm2")
    sp.add_argument("--clients", default="1,8")
    sp.add_argument("--max-tokens", type=int, default=256)
    sp.add_argument("--per-slot", type=int, default=4096, help="context per slot (-c is clients x this)")
    sp.add_argument("--rounds", type=int, default=2, help="each round starts each server once; odd rounds reversed")
    d = sub.add_parser("disconnects")
    d.add_argument("--model", default="smollm2")
    d.add_argument("--requests", type=int, default=1000)
    args = ap.parse_args()
    result = {"engine": bench_engine, "load": bench_load, "chat": bench_chat,
              "disconnects": bench_disconnects, "cold": bench_cold, "drafting": bench_drafting}[args.what](args)
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y-%m-%dT%H%M")
    target = OUT / f"{socket.gethostname()}-{stamp}-{args.what}.json"
    target.write_text(json.dumps({"argv": sys.argv[1:], "cpu_count": os.cpu_count(), "result": result}, indent=1))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
