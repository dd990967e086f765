#!/usr/bin/env python3
"""Issue 46's bench through `llamaplug serve`: time to first token with the prompt cache on disk, against a cold read.

    .tox/py/bin/python bench/disk_cache_serve.py restart [--model smollm2-135m-instruct] [--rounds 4]
    .tox/py/bin/python bench/disk_cache_serve.py reload  [--model gemma-3-270m] [--rounds 4]
    .tox/py/bin/python bench/disk_cache_serve.py ray     [--rounds 3] [--serve-args='--cache-exact -ub 64']

A chat with a ~2,000-token system prompt (`--tokens`) and a question; greedy, streamed, the
client's own clock from the request to the first content chunk. Each round has a cold run and a
warm one, and the two questions swap roles from one round to the next (so every question has
cold and warm runs, interleaved: on a shared machine only ratios within one run mean anything).

  restart: a server with an empty --cache-dir reads question A (cold) and stops; a second server on
           the same directory is asked question B (warm: the system prompt from disk).
  reload:  one server with --models-dir and --cache-dir: A (cold), POST /models/unload and /models/load
           (the load is not timed), then B (warm).
  ray:     `serve --ray --replicas 2` on one node, one --cache-dir; each round a system prompt of its own
           ("Edition N." first): A pinned to one replica (cold; its prefill writes the file), then B
           pinned to the other replica, which never saw it (warm, from disk). The cold reference for the
           reply identity: afterwards, for each round a fresh plain `serve` with no cache directory at
           the replicas' one thread.

Printed and written (--out): each run's TTFT, cached tokens (the reply's timings.cache_n), the disk
hits (/metrics), warm/cold per round (the two runs share the system prompt; the questions have
the same token count), the median, and whether each warm reply equals the cold reply of the same
request.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

QUESTIONS = ("Which shelf holds the atlases?", "Where are the atlases kept?")  # one token count (SmolLM2, Gemma-3)
LINE = "Keep every answer short, exact and polite; cite the shelf a book is on. "
REPLICA_HEADER = "x-llamaplug-replica"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, method: str, path: str, body: dict | None = None, headers: dict | None = None,
            timeout: float = 3600) -> tuple[int, bytes, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None,
                     {"content-type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read(), dict(resp.getheaders())
    finally:
        conn.close()


@contextlib.contextmanager
def server(args: list[str], log: Path, ready_s: float = 900) -> Iterator[tuple[int, subprocess.Popen]]:
    """`llamaplug serve ARGS` on a free port until the block ends (SIGINT: a clean stop, which writes the cache)."""
    port = free_port()
    with log.open("ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "serve", "--host", "127.0.0.1",
                                 "--port", str(port), "--metrics", *args], stdout=fh, stderr=fh, start_new_session=True)
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited ({proc.returncode}): see {log}")
            with contextlib.suppress(OSError):
                if request(port, "GET", "/health", timeout=5)[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve not ready after {ready_s} s: see {log}")
            time.sleep(0.5)
        yield port, proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen, grace: float = 180) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with contextlib.suppress(ProcessLookupError):  # Ray's own processes live in the same session
        os.killpg(proc.pid, signal.SIGKILL)


def system_prompt(port: int, n_tokens: int, edition: str = "", model: str | None = None) -> str:
    text = edition
    while True:
        n = count_tokens(port, text, model)
        if n >= n_tokens:
            return text
        # grow by most of the tokens missing (a line is 17-22 tokens), then check again
        for _ in range(max(1, (n_tokens - n) // 24)):
            text += f"Rule {text.count('Rule ') + 1}: " + LINE


def chat(port: int, system: str, question: str, model: str | None = None, replica: str | None = None,
         max_tokens: int = 24) -> dict:
    """A streamed greedy chat: TTFT (ms, from the request to the first content), the text, the timings, the replica."""
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "seed": 0}
    if model:
        body["model"] = model
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"content-type": "application/json", **({REPLICA_HEADER: replica} if replica else {})})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"chat: {resp.status} {resp.read()[:500]!r}")
    first, text, timings = None, "", None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices", []):
            delta = (choice.get("delta") or {}).get("content") or ""
            if delta and first is None:
                first = time.perf_counter() - t0
            text += delta
        timings = chunk.get("timings") or timings
    conn.close()
    return {"ttft_ms": round((first or time.perf_counter() - t0) * 1000, 1), "text": text,
            "cache_n": (timings or {}).get("cache_n"), "prompt_n": (timings or {}).get("prompt_n"),
            "replica": resp.getheader(REPLICA_HEADER)}


def disk_hits(port: int, replica: str | None = None) -> int:
    body = request(port, "GET", "/metrics", headers={REPLICA_HEADER: replica} if replica else None)[1].decode()
    found = re.search(r"^llamaplug_cache_disk_hits_total (\d+)", body, re.M)
    return int(found.group(1)) if found else -1


def base_args(a: argparse.Namespace, threads: int) -> list[str]:
    return ["-t", str(threads), "-np", "1", "-c", str(a.ctx), "--spec-type", "none", "--log", "warning",
            *shlex.split(a.serve_args)]


def model_path(name: str) -> str:
    from llamaplug.catalog import entries

    entry = next(e for e in entries() if e.name == name)
    path = entry.locate()
    if path is None:
        raise SystemExit(f"{name} is not installed ({entry.install})")
    return str(path)


def count_tokens(port: int, text: str, model: str | None = None) -> int:
    body = {"content": text, **({"model": model} if model else {})}
    return len(json.loads(request(port, "POST", "/tokenize", body)[1])["tokens"])


def same_length_questions(port: int, model: str | None = None) -> None:
    n = [count_tokens(port, q, model) for q in QUESTIONS]
    if n[0] != n[1]:
        print(f"note: the questions' token counts differ: {n}", file=sys.stderr)


def bench_restart(a: argparse.Namespace, work: Path) -> list[dict]:
    rounds = []
    model = model_path(a.model)
    system = None
    for i in range(a.rounds):
        cold_q, warm_q = QUESTIONS if i % 2 == 0 else QUESTIONS[::-1]
        cache = work / f"cache-{i}"
        args = ["-m", model, *base_args(a, a.threads), "--cache-dir", str(cache)]
        with server(args, work / "serve.log") as (port, _):
            if system is None:
                system = system_prompt(port, a.tokens)
                same_length_questions(port)
            cold = chat(port, system, cold_q)
        with server(args, work / "serve.log") as (port, _):
            warm = chat(port, system, warm_q)
            warm["disk_hits"] = disk_hits(port)
        rounds.append({"cold_q": cold_q, "cold": cold, "warm_q": warm_q, "warm": warm})
        print(json.dumps(rounds[-1]), flush=True)
    return rounds


def bench_reload(a: argparse.Namespace, work: Path) -> list[dict]:
    rounds = []
    model = model_path(a.model)
    models = work / "models"
    models.mkdir(exist_ok=True)
    link = models / Path(model).name
    if not link.exists():
        link.symlink_to(model)
    ident = link.stem
    system = None
    for i in range(a.rounds):
        cold_q, warm_q = QUESTIONS if i % 2 == 0 else QUESTIONS[::-1]
        args = ["--models-dir", str(models), *base_args(a, a.threads), "--cache-dir", str(work / f"cache-{i}")]
        with server(args, work / "serve.log") as (port, _):
            load = request(port, "POST", "/models/load", {"model": ident})
            if load[0] != 200:
                raise RuntimeError(f"load: {load}")
            if system is None:
                system = system_prompt(port, a.tokens, model=ident)
                same_length_questions(port, ident)
            cold = chat(port, system, cold_q, model=ident)
            for action in ("unload", "load"):
                done = request(port, "POST", f"/models/{action}", {"model": ident})
                if done[0] != 200:
                    raise RuntimeError(f"{action}: {done}")
            warm = chat(port, system, warm_q, model=ident)
            warm["disk_hits"] = disk_hits(port)
        rounds.append({"cold_q": cold_q, "cold": cold, "warm_q": warm_q, "warm": warm})
        print(json.dumps(rounds[-1]), flush=True)
    return rounds


def wait_for_files(cache: Path, n: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while len(list(cache.glob("*.kv"))) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{cache}: fewer than {n} cache files after {timeout} s")
        time.sleep(0.5)


def bench_ray(a: argparse.Namespace, work: Path) -> list[dict]:
    rounds = []
    model = model_path(a.model)
    cache = work / "cache"
    args = ["-m", model, *base_args(a, 1), "--cache-dir", str(cache), "--ray", "--replicas", "2"]
    with server(args, work / "serve.log", ready_s=1800) as (port, _):
        replicas: list[str] = []
        k = 0
        while len(replicas) < 2:  # each replica's id, from short prompts that the prefix routing spreads
            k += 1
            got = chat(port, f"Note {k}.", "Hi", max_tokens=1)["replica"]
            if got and got not in replicas:
                replicas.append(got)
            if k > 64:
                raise RuntimeError(f"one replica answers every prompt: {replicas}")
        for i in range(a.rounds):
            cold_q, warm_q = QUESTIONS if i % 2 == 0 else QUESTIONS[::-1]
            writer, reader = replicas if i % 2 == 0 else replicas[::-1]
            system = system_prompt(port, a.tokens, edition=f"Edition {i + 1}. ")
            n_files = len(list(cache.glob("*.kv")))
            cold = chat(port, system, cold_q, replica=writer)
            wait_for_files(cache, n_files + 1)
            before = disk_hits(port, reader)
            warm = chat(port, system, warm_q, replica=reader)
            warm["disk_hits"] = disk_hits(port, reader) - before
            rounds.append({"system": system[:20], "cold_q": cold_q, "cold": cold, "warm_q": warm_q, "warm": warm})
            print(json.dumps(rounds[-1]), flush=True)
    references(a, model, work, rounds)
    return rounds


def references(a: argparse.Namespace, model: str, work: Path, rounds: list[dict]) -> None:
    """The cold reply of each round's warm request, for the identity: a plain server at the replicas' one thread,
    a fresh one for each (a slot's first tokens reused from the request before would split the read)."""
    for i, r in enumerate(rounds):
        with server(["-m", model, *base_args(a, 1)], work / "serve.log") as (port, _):
            system = system_prompt(port, a.tokens, edition=f"Edition {i + 1}. ")
            r["reference"] = chat(port, system, r["warm_q"])
        print(json.dumps({"reference": r["reference"]}), flush=True)


def summary(mode: str, a: argparse.Namespace, rounds: list[dict]) -> dict:
    ratios = [r["warm"]["ttft_ms"] / r["cold"]["ttft_ms"] for r in rounds]
    if mode == "ray":
        same = [r["warm"]["text"] == r["reference"]["text"] for r in rounds]
    else:  # the cold run of the warm run's question: the rounds where it was the cold one
        cold_text = {r["cold_q"]: r["cold"]["text"] for r in rounds}
        same = [r["warm"]["text"] == cold_text.get(r["warm_q"]) for r in rounds if r["warm_q"] in cold_text]
    return {"mode": mode, "model": a.model, "tokens": a.tokens, "rounds": len(rounds), "serve_args": a.serve_args,
            "warm_over_cold": [round(x, 4) for x in ratios],
            "median_warm_over_cold": round(statistics.median(ratios), 4),
            "median_cold_ttft_ms": statistics.median(r["cold"]["ttft_ms"] for r in rounds),
            "median_warm_ttft_ms": statistics.median(r["warm"]["ttft_ms"] for r in rounds),
            "cold_prompt_tokens": [r["cold"]["prompt_n"] for r in rounds],
            "warm_cached_tokens": [r["warm"]["cache_n"] for r in rounds],
            "warm_disk_hits": [r["warm"].get("disk_hits") for r in rounds],
            "reply_same_as_cold": same, "details": rounds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["restart", "reload", "ray"])
    p.add_argument("--model", default="smollm2-135m-instruct", help="a catalog name (llamaplug info)")
    p.add_argument("--tokens", type=int, default=2000, help="system prompt tokens")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=1,
                   help="serve -t (ray: 1 a replica; on a shared machine more threads spin)")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--serve-args", default="", metavar="ARGS",
                   help="more `serve` flags for every server, the cold references too (one string: "
                        "--serve-args='--cache-exact -ub 64')")
    p.add_argument("--out", help="write the summary (JSON) here")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="lp-disk-bench-") as d:
        rounds = {"restart": bench_restart, "reload": bench_reload, "ray": bench_ray}[a.mode](a, Path(d))
    result = summary(a.mode, a, rounds)
    print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
