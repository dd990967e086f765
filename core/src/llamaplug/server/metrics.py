"""Prometheus text for /metrics: the engine's counters and gauges, and a recent generation rate.

Two families: llamaplug_* (the engine's own, of the first model) and llama-server's
names (llamacpp:prompt_tokens_total, llamacpp:tokens_predicted_total,
llamacpp:requests_processing, ...: server-context.cpp's metrics) with a `model` label
per served model, so dashboards built for llama-server work unchanged.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

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

    def render(self, served: Iterable[tuple[str, Engine]] = ()) -> str:
        """The metrics text; `served` (name, engine) pairs get llama-server's metrics, labelled by model."""
        stats, rate = self.engine.stats, self.tokens_per_second()
        lines = []
        for name, doc in _COUNTERS:
            lines += [f"# HELP llamaplug_{name}_total {doc}", f"# TYPE llamaplug_{name}_total counter",
                      f"llamaplug_{name}_total {getattr(stats, name)}"]
        gauges = (("slots", "slots (sequences decoded together)", self.engine.n_slots),
                  ("slots_busy", "slots running a request", stats.busy_slots),
                  ("queue_length", "requests waiting for a slot", stats.waiting),
                  ("stored_sequences", "finished sequences whose KV is kept in host memory", stats.stored_sequences),
                  ("stored_bytes", "bytes of that KV", stats.stored_bytes),
                  ("tokens_per_second", "generated tokens per second, recent", round(rate, 3)))
        for name, doc, value in gauges:
            lines += [f"# HELP llamaplug_{name} {doc}", f"# TYPE llamaplug_{name} gauge", f"llamaplug_{name} {value}"]
        for name, doc, value in (("http_requests", "HTTP requests", self.http_requests),
                                 ("http_errors", "HTTP responses with status >= 400", self.http_errors)):
            lines += [f"# HELP llamaplug_{name}_total {doc}", f"# TYPE llamaplug_{name}_total counter",
                      f"llamaplug_{name}_total {value}"]
        lines += llama_server_metrics(list(served), rate, self.engine)
        return "\n".join(lines) + "\n"


# llama-server's metrics that the engine counts: (name, type, help, value of EngineStats). Its timing sums
# (prompt_seconds_total, tokens_predicted_seconds_total) and speculative counters are not kept here.
_LLAMA_SERVER = (
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens",
     lambda s: s.prompt_tokens - s.cached_tokens),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache",
     lambda s: s.cached_tokens),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed", lambda s: s.generated_tokens),
    ("n_decode_total", "counter", "Total number of llama_decode() calls", lambda s: s.decode_steps),
    ("requests_processing", "gauge", "Number of requests processing", lambda s: s.busy_slots),
    ("requests_deferred", "gauge", "Number of requests deferred", lambda s: s.waiting),
)


def llama_server_metrics(served: list[tuple[str, Engine]], rate: float, first: Engine) -> list[str]:
    """llama-server's metric lines for each served model (`rate`: the recent tokens/s of `first`'s engine)."""
    lines: list[str] = []
    for name, kind, doc, value in _LLAMA_SERVER:
        lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}"]
        lines += [f"llamacpp:{name}{{model={_label(model)}}} {value(engine.stats)}" for model, engine in served]
    lines += ["# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s",
              "# TYPE llamacpp:predicted_tokens_seconds gauge"]
    lines += [f"llamacpp:predicted_tokens_seconds{{model={_label(model)}}} {round(rate, 3) if engine is first else 0}"
              for model, engine in served]
    return lines


def _label(value: str) -> str:
    """A Prometheus label value: quoted, with backslash, quote and newline escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

