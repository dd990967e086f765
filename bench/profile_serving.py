#!/usr/bin/env python3
"""Where a chat server's CPU goes: each server thread's CPU time over one run of `serving.py chat`'s load.

    .tox/py/bin/python bench/profile_serving.py [--kind llamaplug|native|router] [--clients 8] [--requests 64]
    .tox/py/bin/python bench/profile_serving.py --spy spy.txt     # also py-spy (pip install py-spy) on ours

On a machine whose cores the decode threads use up, every CPU-second another thread of the
server spends (the event loop: HTTP, JSON, the hand-off of results) is taken from llama_decode.
This prints the throughput, each thread's CPU seconds during the measured run (from
/proc/PID/task/*/stat) and, for ours, the share of the engine's step spent outside
llama_decode and the time a step spends after its decode (sampling each sequence, the text,
the hand-off; all timed in the server process; --kind llamaplug only).
With --spy, py-spy samples every thread (raw format: one collapsed stack a line) for a later look.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import serving  # noqa: E402

# Run in the server process (python -c): time the engine's steps, the decodes inside them and what follows a
# step's decode (sampling, text, the hand-off), and write the sums to the file named by LLAMAPLUG_STEP_REPORT
# when the server is stopped (SIGTERM).
_TIMED_SERVER = """
import os, signal, sys, time
from llamaplug.blocks.context import LlamaContext
from llamaplug.high.engine import Engine
acc = [0.0, 0.0, 0.0, 0]  # steps, decodes, after the decodes (seconds), steps that decoded
decoded = [None]
decode, step = LlamaContext.decode, Engine._step
def timed_decode(self, batch):
    t = time.perf_counter()
    try:
        return decode(self, batch)
    finally:
        decoded[0] = time.perf_counter()
        acc[1] += decoded[0] - t
def timed_step(self):
    t = time.perf_counter()
    decoded[0] = None
    try:
        step(self)
    finally:
        end = time.perf_counter()
        acc[0] += end - t
        if decoded[0] is not None:
            acc[2] += end - decoded[0]
            acc[3] += 1
LlamaContext.decode, Engine._step = timed_decode, timed_step
def report(*_):
    with open(os.environ["LLAMAPLUG_STEP_REPORT"], "w") as fh:
        fh.write(" ".join(map(str, acc)))
    os._exit(0)
signal.signal(signal.SIGTERM, report)
from llamaplug.cli import main
main(sys.argv[1:])
"""


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of `pid`."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def start_timed(model: Path, clients: int, report: Path) -> tuple[subprocess.Popen, int]:
    port = serving.free_port()
    cmd = [sys.executable, "-c", _TIMED_SERVER, "serve", "-m", str(model), "-t", str(serving.THREADS),
           "--parallel", str(clients), "-c", str(clients * 256), "--port", str(port)]
    return serving.launch("the timed", cmd, port, {**os.environ, "LLAMAPLUG_STEP_REPORT": str(report)}), port


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="llamaplug", choices=["llamaplug", "native", "router"])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--spy", help="also record py-spy's raw stacks of every thread to this file (ours only)")
    a = ap.parse_args()
    model = serving.model_path(a.model)
    report = Path(tempfile.mkstemp(suffix=".txt")[1])
    if a.kind == "llamaplug":
        proc, port = start_timed(model, a.clients, report)
    else:
        proc, port = serving.start(a.kind, model, a.clients, 256)
    spy = None
    try:
        asyncio.run(serving.drive_chat(port, a.clients, a.clients))  # warm-up
        if a.spy:
            spy = subprocess.Popen(["py-spy", "record", "-p", str(proc.pid), "-o", a.spy, "--format", "raw",
                                    "-r", "250", "--threads", "--idle", "--nonblocking"])
            time.sleep(1.0)  # py-spy attaches
        before = thread_cpu(proc.pid)
        run = asyncio.run(serving.drive_chat(port, a.clients, a.requests))
        after = thread_cpu(proc.pid)
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait()
        serving.stop(proc)
    print(f"{a.kind}: {run['tokens'] / run['wall_s']:.1f} tok/s over {run['wall_s']:.2f} s, "
          f"errors {len(run['errors'])}")
    for tid, cpu in sorted(((t, c - before.get(t, 0.0)) for t, c in after.items()), key=lambda x: -x[1]):
        if cpu >= 0.01:
            print(f"  thread {tid}{' (main: the event loop)' if tid == proc.pid and a.kind != 'native' else ''}:"
                  f" {cpu:.2f} s CPU")
    if a.kind == "llamaplug" and report.read_text():
        step, decode, after, n = map(float, report.read_text().split())
        print(f"  engine steps (warm-up included): {step:.2f} s, llama_decode {decode:.2f} s, outside it "
              f"{(step - decode) / step:.1%}; after a step's decode {after * 1e3 / n:.2f} ms a step ({n:.0f} steps)")
    report.unlink()


if __name__ == "__main__":
    main()
