"""Prometheus text for /metrics: the engine's counters and gauges, and a recent generation rate."""

from __future__ import annotations

import time
from collections import deque

from ..high.engine import Engine

_COUNTERS = (
    ("requests", "requests given to the engine"),
    ("finished", "requests that ended with a result (cancelled ones included)"),
    ("errors", "requests that ended with an error"),
    ("prompt_tokens", "prompt tokens of admitted requests"),
    ("cached_tokens", "prompt tokens reused from a slot's KV cache instead of decoded"),
    ("generated_tokens", "tokens generated"),
    ("decode_steps", "llama_decode calls (one batch each)"),
)


class Metrics:
    def __init__(self, engine: Engine, window: float = 10.0):
        self.engine = engine
        self.http_requests = 0
        self.http_errors = 0
        self._window = window
        self._samples: deque[tuple[float, int]] = deque()

    def tokens_per_second(self) -> float:
        """Generated tokens per second over about the last `window` seconds (between scrapes)."""
        now, total = time.monotonic(), self.engine.stats.generated_tokens
        self._samples.append((now, total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._window:
            self._samples.popleft()
        t0, n0 = self._samples[0]
        return (total - n0) / (now - t0) if now > t0 else 0.0

    def render(self) -> str:
        stats = self.engine.stats
        lines = []
        for name, doc in _COUNTERS:
            lines += [f"# HELP llamaplug_{name}_total {doc}", f"# TYPE llamaplug_{name}_total counter",
                      f"llamaplug_{name}_total {getattr(stats, name)}"]
        gauges = (("slots", "slots (sequences decoded together)", self.engine.n_slots),
                  ("slots_busy", "slots running a request", stats.busy_slots),
                  ("queue_length", "requests waiting for a slot", stats.waiting),
                  ("stored_sequences", "finished sequences whose KV is kept in host memory", stats.stored_sequences),
                  ("stored_bytes", "bytes of that KV", stats.stored_bytes),
                  ("tokens_per_second", "generated tokens per second, recent", round(self.tokens_per_second(), 3)))
        for name, doc, value in gauges:
            lines += [f"# HELP llamaplug_{name} {doc}", f"# TYPE llamaplug_{name} gauge", f"llamaplug_{name} {value}"]
        for name, doc, value in (("http_requests", "HTTP requests", self.http_requests),
                                 ("http_errors", "HTTP responses with status >= 400", self.http_errors)):
            lines += [f"# HELP llamaplug_{name}_total {doc}", f"# TYPE llamaplug_{name}_total counter",
                      f"llamaplug_{name}_total {value}"]
        return "\n".join(lines) + "\n"
