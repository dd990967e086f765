"""Prometheus text for /metrics: the engines' counters and gauges, and recent generation rates.

Two families. llamaplug_*: each series is the sum over the served models, then one line per
model with a `model` label. llama-server's names (llamacpp:prompt_tokens_total,
llamacpp:tokens_predicted_total, llamacpp:requests_processing, ...: server-context.cpp's
metrics), one line per model with a `model` label, so dashboards built for llama-server work
unchanged. A model's counters outlive its unloads (`retire` keeps them), so they never go back.

A sleeping model (--sleep-idle) shows the gauges it had when it fell asleep (`asleep`), and while every model
sleeps the HTTP counters show their values at the last scrape: as llama-server answers from the snapshot it took
on entering sleep, a scrape of a sleeping server equals the last one before it (a monitor's polls move nothing),
apart from llama-server's two throughput gauges, which report what finished since the last scrape. The HTTP
requests of that time are still counted: they show once a model is loaded again.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable

from ..high.engine import Engine

_COUNTERS = (
    ("requests", "requests given to the engine"),
    ("finished", "requests that ended with a result (cancelled ones included)"),
    ("errors", "requests that ended with an error"),
    ("prompt_tokens", "prompt tokens of admitted requests"),
    ("cached_tokens", "prompt tokens reused from a slot's KV cache instead of decoded"),
    ("generated_tokens", "tokens generated"),
    ("decode_steps", "llama_decode calls (one batch each)"),
    # The prompt cache per tier (high/disk_store.py; with no disk tier these stay 0): a RAM miss is a lookup the
    # host store had no prefix for; a disk miss is one neither tier had, or a disk file refused.
    ("cache_ram_hits", "prompt cache lookups served from host memory (serve --cache-dir)"),
    ("cache_ram_misses", "prompt cache lookups host memory had no prefix for (serve --cache-dir)"),
    ("cache_disk_hits", "prompt cache lookups served from the cache directory"),
    ("cache_disk_misses", "prompt cache lookups neither tier could serve, or whose file was refused"),
    # Speculative decoding (high/speculative.py; serve drafts by default, --spec-type none: these stay 0).
    ("drafted_tokens", "tokens a drafter guessed and the model checked"),
    ("accepted_tokens", "drafted tokens the model's own sampling agreed with"),
    ("drafts", "drafts checked (one per sequence and decode that had guesses)"),
)
# kept for llama-server's families only (no llamaplug_* series): n_tokens_max is a maximum, the rest sums
_NAMES = [name for name, _ in _COUNTERS] + ["prompt_ms", "predicted_ms", "busy_slot_steps", "n_tokens_max"]

# llama-server's counters, from ours (a model's counters: unloaded engines' included). Its per-position
# acceptance is not kept here.
_LLAMA_SERVER_COUNTERS = (
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
     lambda c: c["prompt_tokens"] - c["cached_tokens"]),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", lambda c: c["cached_tokens"]),
    ("tokens_predicted_total", "Number of generation tokens processed", lambda c: c["generated_tokens"]),
    ("n_decode_total", "Total number of llama_decode() calls", lambda c: c["decode_steps"]),
    ("prompt_seconds_total", "Prompt process time", lambda c: c["prompt_ms"] / 1e3),
    ("tokens_predicted_seconds_total", "Predict process time", lambda c: c["predicted_ms"] / 1e3),
    ("n_tokens_max", "Largest observed n_tokens", lambda c: c["n_tokens_max"]),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", lambda c: c["drafted_tokens"]),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model",
     lambda c: c["accepted_tokens"]),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps",
     lambda c: c["drafts"]),
)
# ... and its gauges, from a loaded engine's (or a sleeping model's kept) gauges.
_LLAMA_SERVER_GAUGES = (
    ("requests_processing", "Number of requests processing", lambda g: g["slots_busy"]),
    ("requests_deferred", "Number of requests deferred", lambda g: g["queue_length"]),
)
# Our gauges, each from an engine.
_GAUGES = (("slots", "slots (sequences decoded together)", lambda e: e.n_slots),
           ("slots_busy", "slots running a request", lambda e: e.stats.busy_slots),
           ("queue_length", "requests waiting for a slot", lambda e: e.stats.waiting),
           ("stored_sequences", "finished sequences whose KV is kept in host memory",
            lambda e: e.stats.stored_sequences),
           ("stored_bytes", "bytes of that KV", lambda e: e.stats.stored_bytes),
           ("cache_disk_bytes", "bytes of prompt cache files in the cache directory (serve --cache-dir)",
            lambda e: e.stats.cache_disk_bytes))


class Metrics:
    def __init__(self, engines: Callable[[], list[tuple[str, Engine]]], window: float = 10.0):
        """`engines`: (model id, engine) of each loaded model, asked at each scrape."""
        self.engines = engines
        # llama-server's Process-Start-Time-Unix header on /metrics: despite its name, its ggml_time_us() at the
        # start (CLOCK_MONOTONIC microseconds, as time.monotonic's clock here)
        self.started = time.monotonic_ns() // 1000
        self.http_requests = 0
        self.http_errors = 0
        self._window = window
        self._samples: defaultdict[str | None, deque[tuple[float, int]]] = defaultdict(deque)
        self._retired: defaultdict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(_NAMES, 0))
        # llama-server's throughput gauges are over what finished since the last scrape (its metrics "buckets",
        # reset by each scrape): the counters at the last scrape, per model and (None) all
        self._scraped: dict[str | None, dict[str, float]] = {}
        self._asleep: dict[str, dict[str, float]] = {}  # a sleeping model's gauges as it fell asleep
        self._http_shown = (0, 0)  # the HTTP counters the last scrape showed (while every model sleeps: those)

    def retire(self, model: str, engine: Engine) -> None:
        """Keep the counters of `model`'s engine, which is closing (the model is unloaded)."""
        _add(self._retired[model], engine)
        self._asleep.pop(model, None)

    def asleep(self, model: str, engine: Engine) -> None:
        """`model` falls asleep (after `retire`): its gauges are shown as they are now until it is loaded again."""
        self._asleep[model] = _gauges(engine)

    def _gauges(self, engines: list[tuple[str, Engine]]) -> list[tuple[str, dict[str, float]]]:
        """(model, gauge -> value) of each loaded model, then of each sleeping one (its kept gauges)."""
        loaded = [(m, _gauges(e)) for m, e in engines]
        for m, _ in loaded:
            self._asleep.pop(m, None)  # awake again
        return loaded + list(self._asleep.items())

    def _counters(self) -> dict[str, dict[str, float]]:
        """model -> counter -> value, unloaded models' included."""
        out = {m: dict(c) for m, c in self._retired.items()}
        for model, engine in self.engines():
            _add(out.setdefault(model, dict.fromkeys(_NAMES, 0)), engine)
        return out

    def _since_scrape(self, key: str | None, now: dict[str, float]) -> tuple[float, float]:
        """llama-server's prompt_tokens_seconds and predicted_tokens_seconds of `key`: tokens per second of the
        requests that finished since the last scrape (0 where none did); this scrape starts the next bucket."""
        last = self._scraped.get(key) or dict.fromkeys(_NAMES, 0)
        self._scraped[key] = now
        read = (now["prompt_tokens"] - now["cached_tokens"]) - (last["prompt_tokens"] - last["cached_tokens"])
        prompt_ms, predicted_ms = now["prompt_ms"] - last["prompt_ms"], now["predicted_ms"] - last["predicted_ms"]
        generated = now["generated_tokens"] - last["generated_tokens"]
        return (1e3 * read / prompt_ms if prompt_ms > 0 else 0.0,
                1e3 * generated / predicted_ms if predicted_ms > 0 else 0.0)

    def _rate(self, key: str | None, total: int) -> float:
        """Tokens per second of `key` (a model, None: all) over about the last `window` seconds (between
        scrapes), `total` being its generated tokens now."""
        now, samples = time.monotonic(), self._samples[key]
        samples.append((now, total))
        while len(samples) > 2 and now - samples[1][0] >= self._window:
            samples.popleft()
        t0, n0 = samples[0]
        return (total - n0) / (now - t0) if now > t0 else 0.0

    def render(self) -> str:
        counters = self._counters()
        engines = self.engines()
        gauges = self._gauges(engines)
        if engines or not self._asleep:  # else every model sleeps: the last scrape's (see the module's doc)
            self._http_shown = (self.http_requests, self.http_errors)
        lines = []
        for name, doc in _COUNTERS:
            lines += [f"# HELP llamaplug_{name}_total {doc}", f"# TYPE llamaplug_{name}_total counter",
                      f"llamaplug_{name}_total {sum(c[name] for c in counters.values())}"]
            lines += [f"llamaplug_{name}_total{{model={_label(m)}}} {c[name]}" for m, c in counters.items()]
        for name, doc, _ in _GAUGES:
            lines += [f"# HELP llamaplug_{name} {doc}", f"# TYPE llamaplug_{name} gauge",
                      f"llamaplug_{name} {sum(g[name] for _, g in gauges)}"]
            lines += [f"llamaplug_{name}{{model={_label(m)}}} {g[name]}" for m, g in gauges]
        lines += ["# HELP llamaplug_tokens_per_second generated tokens per second, recent",
                  "# TYPE llamaplug_tokens_per_second gauge",
                  f"llamaplug_tokens_per_second {round(self._rate(None, _generated(counters)), 3)}"]
        for name, doc, value in (("http_requests", "HTTP requests", self._http_shown[0]),
                                 ("http_errors", "HTTP responses with status >= 400", self._http_shown[1])):
            lines += [f"# HELP llamaplug_{name}_total {doc}", f"# TYPE llamaplug_{name}_total counter",
                      f"llamaplug_{name}_total {value}"]
        return "\n".join(lines + self._llama_server(counters, gauges)) + "\n"

    def _llama_server(self, counters: dict[str, dict[str, float]],
                      gauges: list[tuple[str, dict[str, float]]]) -> list[str]:
        """llama-server's families: each its unlabelled line as llama-server writes it (over every model: a
        single-model server's are llama-server's own values), then one line per model with a `model` label."""
        whole: dict[str, float] = dict.fromkeys(_NAMES, 0)
        for c in counters.values():
            _merge(whole, c)
        lines: list[str] = []
        for name, doc, value in _LLAMA_SERVER_COUNTERS:
            lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} counter",
                      f"llamacpp:{name} {value(whole)}"]
            lines += [f"llamacpp:{name}{{model={_label(m)}}} {value(c)}" for m, c in counters.items()]
        for name, doc, gauge in _LLAMA_SERVER_GAUGES:
            lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} gauge",
                      f"llamacpp:{name} {sum(gauge(g) for _, g in gauges)}"]
            lines += [f"llamacpp:{name}{{model={_label(m)}}} {gauge(g)}" for m, g in gauges]
        rates = {m: self._since_scrape(m, c) for m, c in [(None, whole), *counters.items()]}
        for i, (name, doc) in enumerate((("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
                                         ("predicted_tokens_seconds", "Average generation throughput in tokens/s"))):
            lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} gauge"]
            lines += [f"llamacpp:{name}{'' if m is None else f'{{model={_label(m)}}}'} {round(r[i], 3)}"
                      for m, r in rates.items()]
        lines += ["# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call",
                  "# TYPE llamacpp:n_busy_slots_per_decode gauge"]
        lines += [f"llamacpp:n_busy_slots_per_decode{'' if m is None else f'{{model={_label(m)}}}'} "
                  f"{c['busy_slot_steps'] / c['decode_steps'] if c['decode_steps'] else 0.0}"
                  for m, c in [(None, whole), *counters.items()]]
        return lines


def _gauges(engine: Engine) -> dict[str, float]:
    return {name: value(engine) for name, _, value in _GAUGES}


def _generated(counters: dict[str, dict[str, float]]) -> int:
    return int(sum(c["generated_tokens"] for c in counters.values()))


def _add(into: dict[str, float], engine: Engine) -> None:
    """`engine`'s counters added to `into`."""
    _merge(into, {name: getattr(engine.stats, name) for name in _NAMES})


def _merge(into: dict[str, float], counters: dict[str, float]) -> None:
    """`counters` added to `into` (n_tokens_max, a maximum: the larger)."""
    for name in _NAMES:
        value = counters[name]
        into[name] = max(into[name], value) if name == "n_tokens_max" else into[name] + value


def _label(value: str) -> str:
    """A Prometheus label value: quoted, with backslash, quote and newline escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
