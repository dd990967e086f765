"""What the workers share: the workload definition and process measurements (stdlib only).

Imported by bench/run.py, bench/worker_llamaplug.py and bench/worker_peer.py.
The peer worker runs in the peer's own venv, so nothing here may import
llamaplug, llama_cpp or numpy.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

# Text for the prompt-processing test: cut to exactly `pp` tokens by each worker.
PP_TEXT = " ".join(
    f"Section {i}. The river crossed the valley and the town grew along its banks; "
    f"merchants built {i % 7 + 2} bridges, a market, and a library whose shelves held "
    f"maps of the hills, records of harvests, and letters from distant cities."
    for i in range(1, 200)
)


def count_text(start: int, n: int = 400) -> str:
    """'start, start+1, ...': greedy decoding continues it without an end-of-generation token."""
    return ", ".join(str(k) for k in range(start, start + n))


# Generation prompt: short, so the generated tokens sit at the start of the KV cache as in llama-bench's tg.
TG_TEXT = "1, 2, 3, 4, 5, 6, 7, 8,"


@dataclass
class Workload:
    threads: int = 2
    n_ctx: int = 2048  # single-stream context (ours and the peer)
    pp: int = 512  # prompt tokens for prompt processing
    tg: int = 128  # generated tokens for text generation
    batch_npl: tuple[int, ...] = (1, 4, 16)  # parallel sequences
    batch_npp: int = 16  # prompt tokens per sequence
    batch_ntg: int = 64  # generated tokens per sequence
    batch_n_ctx: int = 2048  # context for the batched test (n_seq_max = max(npl))
    inner: int = 3  # pp/tg runs per round and process; the round keeps the fastest (contention only slows)
    warmup: bool = True
    backend: str = "cpu"  # llamaplug backend plugin; a GPU one offloads every layer (native: -ngl 99)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Workload:
        d = json.loads(text)
        d["batch_npl"] = tuple(d["batch_npl"])
        return cls(**d)


def token_digest(tokens: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:12]


def fit(tokens: list[int], n: int, what: str) -> list[int]:
    if len(tokens) < n:
        raise SystemExit(f"bench: the {what} text has only {len(tokens)} tokens, {n} needed")
    return list(tokens[:n])


def status_kb(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: now, VmHWM: peak); 0 where unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    if field == "VmHWM":
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return 0


def mib(kb: int) -> float:
    return round(kb / 1024, 1)


class Timer:
    def __enter__(self) -> Timer:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ms = (time.perf_counter() - self.t0) * 1e3


def emit(result: dict) -> None:
    """The worker's answer: one JSON line on stdout, after a marker (native code may print too)."""
    sys.stdout.flush()
    os.write(1, b"\n@@BENCH@@" + json.dumps(result).encode() + b"\n")


def parse_emitted(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith("@@BENCH@@"):
            return json.loads(line[len("@@BENCH@@"):])
    raise ValueError("the worker printed no result")
