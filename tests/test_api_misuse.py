"""API misuse: a hypothesis state machine drives the public objects through random sequences.

LlamaModel, LlamaContext, LlamaBatch, SamplerChain and Llama (on the tiny
generated model, n_ctx 64 (llama.cpp pads it to 256), n_batch 16, one thread)
go through random sequences of valid and invalid operations: use after close,
closing the model before its contexts, decoding past n_ctx, batch overflow,
invalid sequence ids and positions, sampling before any decode, double close,
get_logits_ith on invalid indices, KV-cache operations on bad sequence ids,
out-of-range integers, corrupted batch arrays, foreign or corrupt state bytes.
A shadow model predicts each outcome: a valid operation must work (and agree
with the shadow: positions, sampled token in the vocabulary, KV positions), a
misuse must raise the LlamaError subclass the shadow names (the exact class is
asserted). Where two misuses meet (a closed
context *and* a bad index) the shadow follows llamaplug's order of checks:
argument checks that need no native object come first, then ClosedError.

A crash cannot fail pytest itself: the machine runs in a child interpreter
(`run_isolated`), and the parent asserts the child's exit status and summary.

Profiles (HYPOTHESIS_PROFILE):
  ci    (default, `make test`): derandomized, 200 sequences of up to 40 steps, well under 60 s.
  long  (the long run):         1,000 sequences of up to 50 steps, random seed, a few minutes:
        HYPOTHESIS_PROFILE=long .venv/bin/pytest -q tests/test_api_misuse.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from llamaplug_testing import run_isolated

TESTS = Path(__file__).resolve().parent
PROFILES = {
    # No shrinking in `make test`: a failure is reported at once, with its whole sequence.
    "ci": {"max_examples": 200, "stateful_step_count": 40, "derandomize": True, "shrink": False},
    "long": {"max_examples": 1000, "stateful_step_count": 50, "derandomize": False, "shrink": True},
}
N_CTX, N_BATCH = 64, 16


# -- the parent (pytest) side ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from fixtures.tiny_gguf import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def test_api_misuse_state_machine(tiny_model):
    profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    if profile not in PROFILES:
        profile = "ci"
    timeout = 1800 if profile == "long" else 600
    proc = run_isolated(
        f"import test_api_misuse as t; t.child_main({str(tiny_model)!r}, {profile!r})",
        path=str(TESTS),
        timeout=timeout,
    )
    tail = f"stdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, f"the state machine failed or crashed (exit {proc.returncode})\n{tail}"
    line = next((x for x in proc.stdout.splitlines() if x.startswith("SUMMARY ")), None)
    assert line is not None, tail
    summary = json.loads(line.split(" ", 1)[1])
    assert summary["sequences"] >= PROFILES[profile]["max_examples"] * 0.9, summary
    # Both valid operations and misuse were exercised, and each misuse kind raised its class.
    assert summary["ok"] > 1000 and summary["raised"] > 500, summary
    for cls in ("ClosedError", "InvalidParameterError", "InvalidTokenError", "ContextOverflowError", "DecodeError",
                "StateError"):
        assert summary["by_class"].get(cls, 0) > 0, (cls, summary)
    print(json.dumps({k: v for k, v in summary.items() if k != "ops"}))


# -- the child side ----------------------------------------------------------------------------


def child_main(model_path: str, profile: str) -> None:
    import time

    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    import llamaplug as lp

    lp.LlamaBackend.init()
    machine = _machine(model_path)
    t0 = time.perf_counter()
    options = dict(PROFILES[profile])
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if options.pop("shrink") else [])
    run_state_machine_as_test(machine, settings=settings(
        deadline=None, database=None, print_blob=True, phases=phases,
        suppress_health_check=list(HealthCheck), **options))
    stats = dict(machine.stats, profile=profile, seconds=round(time.perf_counter() - t0, 1))
    print("SUMMARY " + json.dumps(stats), flush=True)


def _machine(model_path: str):
    """The state machine class (built here, in the child, where llamaplug may be imported)."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

    import llamaplug as lp

    stats = {"sequences": 0, "steps": 0, "ok": 0, "raised": 0, "by_class": {}}

    class Shadow:
        closed = False

    class ModelS(Shadow):
        def __init__(self, obj):
            self.obj = obj
            self.contexts: list[CtxS] = []

    class CtxS(Shadow):
        """What the context holds: KV cells [pos, {seqs}], n_past, output flags of the last batch."""

        def __init__(self, obj, model: ModelS, n_seq_max: int):
            self.obj, self.model, self.n_seq_max = obj, model, n_seq_max
            self.n_ctx, self.n_batch = obj.n_ctx, obj.n_batch
            self.cells: list[list] = []
            self.n_past = 0
            self.outputs: list[int] = []
            self.self_closed = False

        @property
        def closed(self) -> bool:  # type: ignore[override]
            return self.self_closed or self.model.closed

        def positions(self, seq: int) -> list[int]:
            return [c[0] for c in self.cells if seq in c[1]]

        def pos_max(self, seq: int) -> int:
            return max(self.positions(seq), default=-1)

        def pos_min(self, seq: int) -> int:
            return min(self.positions(seq), default=-1)

        def native_verdict(self, entries: list[tuple[int, int, tuple[int, ...], bool]]):
            """What llama_decode says about a batch that passed llamaplug's checks: None (ok) or a class."""
            per_seq: dict[int, list[int]] = {}
            for _, pos, seqs, _ in entries:
                for s in dict.fromkeys(seqs):
                    per_seq.setdefault(s, []).append(pos)
                distinct = set(seqs)
                for a in distinct:  # coupled sequences must agree in the memory
                    for b in distinct:
                        if (self.pos_min(a), self.pos_max(a)) != (self.pos_min(b), self.pos_max(b)):
                            return lp.DecodeError
            for s, ps in per_seq.items():
                if any(b < a for a, b in zip(ps, ps[1:])):
                    return lp.DecodeError
                p0 = self.pos_max(s)
                if p0 >= 0 and min(ps) != p0 + 1:
                    return lp.DecodeError
                if max(ps) - min(ps) + 1 > len(set(ps)):
                    return lp.DecodeError
            if len(self.cells) + len(entries) > self.n_ctx:
                return lp.ContextOverflowError
            return None

        def apply(self, entries) -> None:
            for _, pos, seqs, _ in entries:
                self.cells.append([pos, set(seqs)])
            self.outputs = [int(bool(lg)) for *_, lg in entries]
            self.n_past = max(self.n_past, max(pos for _, pos, _, _ in entries) + 1)

    class BatchS:
        def __init__(self, obj, capacity: int, n_seq_max: int):
            self.obj, self.capacity, self.n_seq_max = obj, capacity, n_seq_max
            self.entries: list[tuple[int, int, tuple[int, ...], bool]] = []

    class SamplerS(Shadow):
        def __init__(self, obj):
            self.obj = obj

    class LlamaS(Shadow):
        def __init__(self, obj):
            self.obj = obj

    n_vocab = 64
    tokens_st = st.one_of(st.integers(0, n_vocab - 1), st.integers(0, n_vocab - 1), st.integers(0, n_vocab - 1),
                          st.sampled_from([-1, -(2**31), n_vocab, n_vocab + 1, 2**31 - 1]))
    seq_st = st.one_of(st.integers(0, 1), st.integers(0, 1), st.integers(0, 1),
                       st.sampled_from([-1, 2, 3, 255, 2**31 - 1]))
    pick = st.integers(0, 15)

    def record(exc: BaseException | None, what: str = "") -> None:
        stats["steps"] += 1
        stats.setdefault("ops", {})[what] = stats.setdefault("ops", {}).get(what, 0) + 1
        if exc is None:
            stats["ok"] += 1
        else:
            stats["raised"] += 1
            name = type(exc).__name__
            stats["by_class"][name] = stats["by_class"].get(name, 0) + 1

    def expect(allowed, fn, what: str):
        """allowed None: fn must succeed; else it must raise exactly one of the classes in `allowed`."""
        if allowed is not None and not isinstance(allowed, tuple):
            allowed = (allowed,)
        try:
            result = fn()
        except lp.LlamaError as exc:
            record(exc, what)
            if allowed is None:
                raise AssertionError(f"{what}: a valid operation raised {type(exc).__name__}: {exc}") from exc
            assert type(exc) in allowed, (
                f"{what}: raised {type(exc).__name__} ({exc}), expected {[c.__name__ for c in allowed]}")
            return exc
        record(None, what)
        if allowed is not None:
            raise AssertionError(f"{what}: expected {[c.__name__ for c in allowed]}, it returned {result!r:.200}")
        return result

    def close(obj, label: str, twice: bool) -> None:
        """close() succeeds, and so does a second close()."""
        expect(None, obj.close, f"{label}.close()")
        if twice:
            expect(None, obj.close, f"{label}.close() again")

    class Machine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            stats["sequences"] += 1
            self.models: list[ModelS] = []
            self.contexts: list[CtxS] = []
            self.batches: list[BatchS] = []
            self.samplers: list[SamplerS] = []
            self.llamas: list[LlamaS] = []

        @initialize()
        def start(self):
            """Every sequence starts with a model, a two-sequence context, a batch and a sampler."""
            self.load_model()
            self.new_context(0, 2)
            self.new_batch(16, 2)
            self.new_sampler("greedy")

        def teardown(self):
            for m in self.models:
                m.obj.close()
            for s in self.samplers:
                s.obj.close()
            for x in self.llamas:
                x.obj.close()

        # -- models ----------------------------------------------------------------------------
        @precondition(lambda self: len(self.models) < 3)
        @rule()
        def load_model(self):
            obj = expect(None, lambda: lp.LlamaModel(model_path), "LlamaModel()")
            assert obj.n_vocab == n_vocab
            self.models.append(ModelS(obj))

        @precondition(lambda self: self.models)
        @rule(i=pick, twice=st.booleans())
        def close_model(self, i, twice):
            m = self.models[i % len(self.models)]
            close(m.obj, "model", twice)
            m.closed = True

        @precondition(lambda self: self.models)
        @rule(i=pick, text=st.text(max_size=12), add_bos=st.booleans())
        def tokenize(self, i, text, add_bos):
            m = self.models[i % len(self.models)]
            bad_text = any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)
            allowed = lp.InvalidParameterError if bad_text else (lp.ClosedError if m.closed else None)
            out = expect(allowed, lambda: m.obj.tokenize(text, add_bos), "tokenize")
            if allowed is None:
                assert all(0 <= t < n_vocab for t in out), out

        @precondition(lambda self: self.models)
        @rule(i=pick, tokens=st.lists(tokens_st, max_size=4))
        def detokenize(self, i, tokens):
            m = self.models[i % len(self.models)]
            bad = any(not 0 <= t < n_vocab for t in tokens)
            allowed = lp.InvalidTokenError if bad else (lp.ClosedError if m.closed else None)
            text = expect(allowed, lambda: m.obj.detokenize(tokens), "detokenize")
            if allowed is None:
                assert isinstance(text, str)

        # -- contexts --------------------------------------------------------------------------
        @precondition(lambda self: self.models and len(self.contexts) < 4)
        @rule(i=pick, n_seq_max=st.sampled_from([1, 2]))
        def new_context(self, i, n_seq_max):
            m = self.models[i % len(self.models)]
            params = lp.ContextParams(n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, n_seq_max=n_seq_max,
                                      kv_unified=True, n_threads=1)
            obj = expect(lp.ClosedError if m.closed else None, lambda: lp.LlamaContext(m.obj, params),
                         "LlamaContext()")
            if not m.closed:
                c = CtxS(obj, m, n_seq_max)
                m.contexts.append(c)
                self.contexts.append(c)

        @precondition(lambda self: self.models)
        @rule(i=pick, field=st.sampled_from(["n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_threads"]),
              value=st.sampled_from([-1, 0, 2**40, 100000, "many"]))
        def bad_context_params(self, i, field, value):
            if field == "n_ctx" and value == 0:
                value = -1  # 0 means "the model's training context", which is valid
            if value == 100000 and field not in ("n_seq_max", "n_threads"):
                return  # a valid (if large) value
            kw = {"n_ctx": N_CTX, "n_threads": 1, field: value}
            # Every bound is a field constraint of the params (2**40 > int32, 100000 > 256 sequences or
            # 512 threads): refused before any context or model sees it.
            expect(lp.InvalidParameterError, lambda: lp.ContextParams(**kw), f"ContextParams({field}={value})")

        @precondition(lambda self: self.models)
        @rule(i=pick)
        def too_many_sequences(self, i):
            params = lp.ContextParams(n_ctx=N_CTX, n_seq_max=lp.raw.llama_max_parallel_sequences(), n_threads=1)
            expect(lp.InvalidParameterError, lambda: params.replace(n_seq_max=params.n_seq_max + 1),
                   "n_seq_max too large")

        @precondition(lambda self: self.contexts)
        @rule(i=pick, twice=st.booleans())
        def close_context(self, i, twice):
            c = self.contexts[i % len(self.contexts)]
            close(c.obj, "context", twice)
            c.self_closed = True

        @precondition(lambda self: self.contexts)
        @rule(i=pick, tokens=st.lists(tokens_st, max_size=40),
              where=st.sampled_from(["next", "next", "next", "zero", "negative", "far", "end"]))
        def eval_tokens(self, i, tokens, where):
            c = self.contexts[i % len(self.contexts)]
            n_past = {"next": c.n_past, "zero": 0, "negative": -1, "far": c.n_past + 3,
                      "end": c.n_ctx - len(tokens) + 1}[where]
            if any(not 0 <= t < n_vocab for t in tokens):
                arg = lp.InvalidTokenError
            elif not tokens or n_past < 0:
                arg = lp.InvalidParameterError
            else:
                arg = None
            if arg is not None or c.closed:
                expect(arg or lp.ClosedError, lambda: c.obj.eval(tokens, n_past), "eval")
                return
            if n_past + len(tokens) > c.n_ctx:
                expect(lp.ContextOverflowError, lambda: c.obj.eval(tokens, n_past), "eval past n_ctx")
                return
            # Chunks of n_batch, each a decode of sequence 0; the first failing one raises.
            chunks = [tokens[k:k + c.n_batch] for k in range(0, len(tokens), c.n_batch)]
            verdict, done = None, []
            for k, chunk in enumerate(chunks):
                start = n_past + k * c.n_batch
                entries = [(t, start + j, (0,), j == len(chunk) - 1) for j, t in enumerate(chunk)]
                verdict = c.native_verdict(entries)
                if verdict is not None:
                    break
                c.apply(entries)
                done.append(chunk)
            expect(verdict, lambda: c.obj.eval(tokens, n_past), f"eval at {where}")
            if verdict is None:
                c.n_past = n_past + len(tokens)
            assert c.obj.n_past == c.n_past, (c.obj.n_past, c.n_past)

        @precondition(lambda self: self.contexts)
        @rule(i=pick, extra=st.sampled_from([1, 2, 200]))
        def eval_past_n_ctx(self, i, extra):
            """More tokens than the window has room for, at n_past: refused before anything is decoded."""
            c = self.contexts[i % len(self.contexts)]
            tokens = [1] * (c.n_ctx - c.n_past + extra) if not c.closed else [1]
            allowed = lp.ClosedError if c.closed else lp.ContextOverflowError
            expect(allowed, lambda: c.obj.eval(tokens, c.n_past), "eval past n_ctx")
            assert c.closed or c.obj.n_past == c.n_past

        @precondition(lambda self: self.contexts)
        @rule(i=pick, token=tokens_st)
        def decode_single(self, i, token):
            c = self.contexts[i % len(self.contexts)]
            if not 0 <= token < n_vocab:
                expect(lp.InvalidTokenError, lambda: c.obj.decode_single(token), "decode_single bad token")
                return
            if c.closed:
                expect(lp.ClosedError, lambda: c.obj.decode_single(token), "decode_single closed")
                return
            if c.n_past >= c.n_ctx:
                expect(lp.ContextOverflowError, lambda: c.obj.decode_single(token), "decode_single full")
                return
            entries = [(token, c.n_past, (0,), True)]
            verdict = c.native_verdict(entries)
            expect(verdict, lambda: c.obj.decode_single(token), "decode_single")
            if verdict is None:
                c.apply(entries)
            assert c.obj.n_past == c.n_past, (c.obj.n_past, c.n_past)

        @precondition(lambda self: self.contexts)
        @rule(i=pick, idx=st.sampled_from([-1, -1, 0, 1, 5, 15, 16, -2, -17, 2**31 - 1, -(2**31)]))
        def get_logits_ith(self, i, idx):
            c = self.contexts[i % len(self.contexts)]
            n = len(c.outputs)
            j = idx + n if idx < 0 else idx
            valid = 0 <= j < n and c.outputs[j]
            allowed = lp.ClosedError if c.closed else (None if valid else lp.InvalidParameterError)
            row = expect(allowed, lambda: c.obj.get_logits_ith(idx), f"get_logits_ith({idx})")
            if allowed is None:
                assert row.shape == (n_vocab,)

        @precondition(lambda self: self.contexts)
        @rule(i=pick)
        def get_logits(self, i):
            c = self.contexts[i % len(self.contexts)]
            n_out = sum(c.outputs)
            allowed = lp.InvalidParameterError if not n_out else (lp.ClosedError if c.closed else None)
            out = expect(allowed, c.obj.get_logits, "get_logits")
            if allowed is None:
                assert out.shape == (n_out, n_vocab)

        @precondition(lambda self: self.contexts)
        @rule(i=pick)
        def clear_cache(self, i):
            c = self.contexts[i % len(self.contexts)]
            expect(lp.ClosedError if c.closed else None, c.obj.clear_cache, "clear_cache")
            if not c.closed:
                c.cells, c.n_past, c.outputs = [], 0, []

        @precondition(lambda self: self.contexts)
        @rule(i=pick, seq=seq_st, p0=st.sampled_from([-1, 0, 1, 3, 2**31 - 1]), p1=st.sampled_from([-1, 1, 2, 5]))
        def kv_seq_rm(self, i, seq, p0, p1):
            c = self.contexts[i % len(self.contexts)]
            bad = not (seq == -1 or 0 <= seq < c.n_seq_max)
            allowed = lp.ClosedError if c.closed else (lp.InvalidParameterError if bad else None)
            ok = expect(allowed, lambda: c.obj.kv_cache_seq_rm(seq, p0, p1), "kv_cache_seq_rm")
            if allowed is None:
                assert ok is True
                lo, hi = max(p0, 0) if p0 >= 0 else 0, p1 if p1 >= 0 else float("inf")
                for cell in c.cells:
                    if lo <= cell[0] < hi:
                        cell[1] = set() if seq == -1 else cell[1] - {seq}
                c.cells = [cell for cell in c.cells if cell[1]]
                if seq in (0, -1):
                    c.n_past = c.pos_max(0) + 1
                assert c.obj.n_past == c.n_past

        @precondition(lambda self: self.contexts)
        @rule(i=pick, src=seq_st, dst=seq_st)
        def kv_seq_cp(self, i, src, dst):
            c = self.contexts[i % len(self.contexts)]
            bad = not (0 <= src < c.n_seq_max and 0 <= dst < c.n_seq_max)
            allowed = lp.ClosedError if c.closed else (lp.InvalidParameterError if bad else None)
            expect(allowed, lambda: c.obj.kv_cache_seq_cp(src, dst), "kv_cache_seq_cp")
            if allowed is None:
                for cell in c.cells:
                    if src in cell[1]:
                        cell[1].add(dst)

        @precondition(lambda self: self.contexts)
        @rule(i=pick, seq=seq_st)
        def kv_seq_keep(self, i, seq):
            c = self.contexts[i % len(self.contexts)]
            bad = not 0 <= seq < c.n_seq_max
            allowed = lp.ClosedError if c.closed else (lp.InvalidParameterError if bad else None)
            expect(allowed, lambda: c.obj.kv_cache_seq_keep(seq), "kv_cache_seq_keep")
            if allowed is None:
                c.cells = [[cell[0], {seq}] for cell in c.cells if seq in cell[1]]

        @precondition(lambda self: self.contexts)
        @rule(i=pick, seq=seq_st, which=st.sampled_from(["min", "max"]))
        def kv_seq_pos(self, i, seq, which):
            c = self.contexts[i % len(self.contexts)]
            bad = not 0 <= seq < c.n_seq_max
            allowed = lp.ClosedError if c.closed else (lp.InvalidParameterError if bad else None)
            fn = c.obj.kv_cache_seq_pos_min if which == "min" else c.obj.kv_cache_seq_pos_max
            got = expect(allowed, lambda: fn(seq), f"kv_cache_seq_pos_{which}")
            if allowed is None:
                assert got == (c.pos_min(seq) if which == "min" else c.pos_max(seq)), (got, c.cells)

        @precondition(lambda self: self.contexts)
        @rule(i=pick)
        def state_roundtrip(self, i):
            c = self.contexts[i % len(self.contexts)]
            data = expect(lp.ClosedError if c.closed else None, c.obj.state_get, "state_get")
            if c.closed:
                return
            expect(None, lambda: c.obj.state_set(data), "state_set")
            c.outputs, c.n_past = [], c.pos_max(0) + 1  # logits are not restored; n_past follows sequence 0
            assert c.obj.n_past == c.n_past, (c.obj.n_past, c.n_past)

        @precondition(lambda self: self.contexts)
        @rule(i=pick, kind=st.sampled_from(["empty", "short", "junk", "huge_name", "truncated", "arch"]))
        def state_set_junk(self, i, kind):
            """Bytes that are not a state of this context: StateError, and the process lives."""
            c = self.contexts[i % len(self.contexts)]
            if kind in ("truncated", "arch") and c.closed:
                kind = "junk"
            data = {
                "empty": lambda: b"",
                "short": lambda: b"\x01\x00",
                "junk": lambda: bytes(range(256)) * 3,
                "huge_name": lambda: b"\xb7\x7e\xac\xfe" + bytes(1000),  # a 4 GiB architecture name
                "truncated": lambda: c.obj.state_get()[:-7],
                "arch": lambda: b"\x05\x00\x00\x00gpt2x" + c.obj.state_get()[9:],
            }[kind]()
            head_ok = kind in ("truncated", "arch")
            allowed = lp.ClosedError if c.closed and head_ok else lp.StateError
            expect(allowed, lambda: c.obj.state_set(data), f"state_set({kind})")
            if head_ok and not c.closed:
                # llama.cpp may have emptied the cache before it gave up: start this context afresh.
                expect(None, c.obj.clear_cache, "clear_cache")
                c.cells, c.n_past, c.outputs = [], 0, []

        # -- batches ---------------------------------------------------------------------------
        @precondition(lambda self: len(self.batches) < 4)
        @rule(capacity=st.sampled_from([1, 4, 16, 17, 0, -1, 2**40]), n_seq_max=st.sampled_from([1, 2, 0, 2**40]))
        def new_batch(self, capacity, n_seq_max):
            bad = not 1 <= capacity <= 2**31 - 1 or not 1 <= n_seq_max <= 256
            obj = expect(lp.InvalidParameterError if bad else None, lambda: lp.LlamaBatch(capacity, n_seq_max),
                         f"LlamaBatch({capacity}, {n_seq_max})")
            if not bad:
                self.batches.append(BatchS(obj, capacity, n_seq_max))

        @precondition(lambda self: self.batches)
        @rule(i=pick, token=tokens_st, pos=st.one_of(st.just("next"), st.integers(-2, 70), st.just(2**31 - 1)),
              seqs=st.lists(seq_st, min_size=0, max_size=3, unique=True), logits=st.booleans(),
              big=st.sampled_from([None, None, None, None, "token", "pos", "seq"]))
        def batch_add(self, i, token, pos, seqs, logits, big):
            b = self.batches[i % len(self.batches)]
            if pos == "next":
                last = {s: p for _, p, ss, _ in b.entries for s in ss}
                pos = max((last.get(s, -1) + 1 for s in seqs), default=0)
                big = "pos" if pos > 2**31 - 1 else big
            if big == "token":
                token = 2**40
            elif big == "pos":
                pos = max(pos, 2**31) if pos > 0 else -(2**40)
            elif big == "seq":
                seqs = [2**40]
            if big is not None:
                expect(lp.InvalidParameterError, lambda: b.obj.add(token, pos, seqs, logits), f"batch.add {big}")
                return
            if not 1 <= len(seqs) <= b.n_seq_max or len(b.entries) >= b.capacity:
                expect(lp.InvalidParameterError, lambda: b.obj.add(token, pos, seqs, logits), "batch.add misuse")
                return
            expect(None, lambda: b.obj.add(token, pos, seqs, logits), "batch.add")
            b.entries.append((token, pos, tuple(seqs), logits))

        @precondition(lambda self: self.batches)
        @rule(i=pick, tokens=st.lists(st.integers(0, n_vocab - 1), max_size=20), seq=st.integers(0, 1),
              pos0=st.one_of(st.just("next"), st.integers(0, 60)))
        def batch_add_sequence(self, i, tokens, seq, pos0):
            b = self.batches[i % len(self.batches)]
            if pos0 == "next":
                pos0 = max((p + 1 for _, p, ss, _ in b.entries if seq in ss), default=0)
            too_far = bool(tokens) and pos0 + len(tokens) - 1 > 2**31 - 1
            if too_far or len(b.entries) + len(tokens) > b.capacity:
                expect(lp.InvalidParameterError, lambda: b.obj.add_sequence(tokens, seq, False, pos0), "overflow")
                return
            expect(None, lambda: b.obj.add_sequence(tokens, seq, False, pos0), "batch.add_sequence")
            b.entries += [(t, pos0 + j, (seq,), j == len(tokens) - 1) for j, t in enumerate(tokens)]

        @precondition(lambda self: self.batches and self.contexts)
        @rule(i=pick, j=pick, seq=st.integers(0, 1), k=st.integers(1, 6), coupled=st.booleans(),
              shift=st.sampled_from([0, 0, 0, 0, 1, -1, 2, "restart"]), decode_now=st.booleans())
        def fill_batch_for_context(self, i, j, seq, k, coupled, shift, decode_now):
            """k tokens that continue `seq` of a context (shift != 0: a gap or an overlap llama.cpp refuses)."""
            b = self.batches[i % len(self.batches)]
            c = self.contexts[j % len(self.contexts)]
            expect(None, b.obj.clear, "batch.clear")
            b.entries = []
            seqs = (0, 1) if coupled and b.n_seq_max >= 2 else (seq,)
            start = 0 if shift == "restart" else c.pos_max(seqs[0]) + 1 + shift
            for n in range(min(k, b.capacity)):
                entry = ((n * 7 + 3) % n_vocab, start + n, seqs, n == min(k, b.capacity) - 1)
                expect(lp.InvalidParameterError if entry[1] < -(2**31) else None,
                       lambda e=entry: b.obj.add(e[0], e[1], e[2], e[3]), "batch.add")
                b.entries.append(entry)
            if decode_now:
                self._decode(b, c)

        @precondition(lambda self: self.batches)
        @rule(i=pick)
        def batch_clear(self, i):
            b = self.batches[i % len(self.batches)]
            expect(None, b.obj.clear, "batch.clear")
            b.entries = []

        @precondition(lambda self: self.batches)
        @rule(i=pick, field=st.sampled_from(["n_seq_id_zero", "n_seq_id_big", "n_seq_id_negative", "n_tokens"]))
        def batch_raw_arrays(self, i, field):
            """Its arrays are public: corrupting them must be refused at decode, not crash llama.cpp."""
            b = self.batches[i % len(self.batches)]
            if not self.contexts or not b.entries:
                return
            c = self.contexts[0]
            saved = (b.obj.n_seq_id.copy(), b.obj.n_tokens)
            k = len(b.entries) - 1
            if field == "n_tokens":
                b.obj.n_tokens = b.capacity + 3
            else:
                b.obj.n_seq_id[k] = {"n_seq_id_zero": 0, "n_seq_id_big": b.n_seq_max + 1000,
                                     "n_seq_id_negative": -3}[field]
            try:
                bad_token = any(not 0 <= t < n_vocab for t, *_ in b.entries)
                if field == "n_tokens":  # checked first, before the context is touched
                    allowed = lp.InvalidParameterError
                elif c.closed:
                    allowed = lp.ClosedError
                elif len(b.entries) > c.n_batch:
                    allowed = lp.InvalidParameterError
                else:
                    allowed = lp.InvalidTokenError if bad_token else lp.InvalidParameterError
                expect(allowed, lambda: c.obj.decode(b.obj), f"decode with corrupt {field}")
            finally:
                b.obj.n_seq_id[:] = saved[0]
                b.obj.n_tokens = saved[1]

        @precondition(lambda self: self.batches and self.contexts)
        @rule(i=pick, j=pick)
        def decode_batch(self, i, j):
            self._decode(self.batches[i % len(self.batches)], self.contexts[j % len(self.contexts)])

        def _decode(self, b: BatchS, c: CtxS) -> None:
            entries = b.entries
            n = len(entries)
            if n == 0:
                arg = lp.InvalidParameterError
            elif c.closed:
                arg = None
            elif n > c.n_batch:
                arg = lp.InvalidParameterError
            elif any(not 0 <= t < n_vocab for t, *_ in entries):
                arg = lp.InvalidTokenError
            elif any(not 0 <= s < c.n_seq_max for _, _, ss, _ in entries for s in ss):
                arg = lp.InvalidParameterError
            elif min(p for _, p, _, _ in entries) < 0:
                arg = lp.InvalidParameterError
            elif max(p for _, p, _, _ in entries) >= c.n_ctx:
                arg = lp.ContextOverflowError
            else:
                arg = None
            if c.closed:  # only the empty-batch check comes before the context is touched
                allowed = lp.InvalidParameterError if n == 0 else lp.ClosedError
                expect(allowed, lambda: c.obj.decode(b.obj), "decode on a closed context")
                return
            if arg is not None:
                expect(arg, lambda: c.obj.decode(b.obj), "decode misuse")
                return
            verdict = c.native_verdict(entries)
            key = "decode:" + (verdict.__name__ if verdict else "ok")
            stats[key] = stats.get(key, 0) + 1
            expect(verdict, lambda: c.obj.decode(b.obj), "decode")
            if verdict is None:
                c.apply(entries)
            assert c.obj.n_past == c.n_past, (c.obj.n_past, c.n_past)

        # -- samplers --------------------------------------------------------------------------
        @precondition(lambda self: len(self.samplers) < 3)
        @rule(kind=st.sampled_from(["greedy", "dist", "penalties", "bad_top_p", "bad_seed", "bad_min_p"]))
        def new_sampler(self, kind):
            makers = {
                "greedy": lambda: lp.SamplerChain().greedy(),
                "dist": lambda: lp.SamplerChain().top_k(8).top_p(0.9).temp(0.7).dist(1234),
                "penalties": lambda: lp.SamplerChain().penalties(16, 1.1).greedy(),
                "bad_top_p": lambda: lp.SamplerChain().top_p(1.5),
                "bad_seed": lambda: lp.SamplerChain().dist(-1),
                "bad_min_p": lambda: lp.SamplerChain().min_p(-0.5),
            }
            bad = kind.startswith("bad_")
            obj = expect(lp.InvalidParameterError if bad else None, makers[kind], f"sampler {kind}")
            if not bad:
                self.samplers.append(SamplerS(obj))

        @precondition(lambda self: self.samplers)
        @rule(i=pick, twice=st.booleans())
        def close_sampler(self, i, twice):
            s = self.samplers[i % len(self.samplers)]
            close(s.obj, "sampler", twice)
            s.closed = True

        @precondition(lambda self: self.samplers and self.contexts)
        @rule(i=pick, j=pick, idx=st.sampled_from([-1, -1, 0, 3, 16, -20]))
        def sample(self, i, j, idx):
            s = self.samplers[i % len(self.samplers)]
            c = self.contexts[j % len(self.contexts)]
            n = len(c.outputs)
            k = idx + n if idx < 0 else idx
            valid_idx = 0 <= k < n and c.outputs[k]
            if s.closed:
                allowed = (lp.ClosedError,)
            elif not valid_idx:
                allowed = (lp.InvalidParameterError,)
            elif c.closed:
                allowed = (lp.ClosedError,)
            else:
                allowed = None
            token = expect(allowed, lambda: s.obj.sample(c.obj, idx), "sample")
            if allowed is None:
                assert 0 <= token < n_vocab, token

        # -- Llama -----------------------------------------------------------------------------
        @precondition(lambda self: len(self.llamas) < 2)
        @rule()
        def load_llama(self):
            params = lp.LlamaParams(model_path=model_path, n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH,
                                    n_threads=1)
            self.llamas.append(LlamaS(expect(None, lambda: lp.Llama.load(params), "Llama.load")))

        @precondition(lambda self: self.llamas)
        @rule(i=pick, twice=st.booleans())
        def close_llama(self, i, twice):
            x = self.llamas[i % len(self.llamas)]
            close(x.obj, "Llama", twice)
            x.closed = True

        @precondition(lambda self: self.llamas)
        @rule(i=pick, prompt=st.one_of(st.lists(tokens_st, max_size=6), st.text(alphabet="abcdehlort .", max_size=20),
                                       st.just("long")),
              max_tokens=st.sampled_from([0, 1, 3, -1, None]), stream=st.booleans())
        def completion(self, i, prompt, max_tokens, stream):
            x = self.llamas[i % len(self.llamas)]
            if prompt == "long":
                prompt = [1] * 300
            n_ctx = 256
            if max_tokens is not None and max_tokens < 0:
                allowed = (lp.InvalidParameterError,)
            elif isinstance(prompt, list) and any(not 0 <= t < n_vocab for t in prompt):
                allowed = (lp.InvalidTokenError,)
            elif isinstance(prompt, list) and not prompt:
                allowed = (lp.InvalidParameterError,)
            elif x.closed:
                allowed = (lp.ClosedError,)
            elif isinstance(prompt, list) and len(prompt) >= n_ctx:
                allowed = (lp.ContextOverflowError,)
            else:
                allowed = None
            done = expect(allowed, lambda: x.obj.create_completion(prompt, max_tokens=max_tokens, stream=stream),
                          "completion")
            if allowed is None:
                tokens = [t for chunk in done for t in chunk.tokens] if stream else done.tokens
                if max_tokens is not None:
                    assert len(tokens) <= max_tokens, (tokens, max_tokens)
                assert all(0 <= t < n_vocab for t in tokens)

        @invariant()
        def closed_objects_say_so(self):
            for m in self.models:
                assert m.obj.closed == m.closed
            for c in self.contexts:
                assert c.obj.closed == c.closed, (c.obj.closed, c.closed)
            for s in self.samplers:
                assert s.obj.closed == s.closed

    Machine.stats = stats
    return Machine
