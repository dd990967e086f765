"""Every compute of a Llama's runs on its engine's thread (high/engine.py, `Engine.call`): the embedding contexts'
decodes, rerank, the warm-up, a projector's opening (tests/test_plugins.py).

Why it matters: the CPU backend's threads are OpenMP's, and OpenMP keeps a team of them for every thread that ever
computed; past the cores, each barrier between graph nodes sleeps. One embedding computed on the caller's thread
slowed the engine's generation by a quarter for the rest of the process (SmolLM2, 2 cores, 2 threads: 125 -> 80
tokens/s in-process, 105 -> 80 in `serve` after one /v1/embeddings request; bench/results/arch/one-compute-thread).
"""

from __future__ import annotations

import contextvars
import os
import threading
import time

import pytest
from fixtures.tiny_gguf import write_tiny_reranker

import llamaplug as lp
from llamaplug.blocks.cancellation import CancelFlag
from llamaplug.blocks.context import LlamaContext
from llamaplug.errors import RequestCancelledError
from llamaplug.high import engine as engine_module


@pytest.fixture
def computing(monkeypatch):
    """The names of the threads that called LlamaContext.decode / encode (the real ones still run); by name, since
    an engine's worker that idled past IDLE_EXIT_S is another thread of the same name."""
    seen: set[str] = set()
    for name in ("decode", "encode"):
        original = getattr(LlamaContext, name)

        def spy(self, batch, _original=original):
            seen.add(threading.current_thread().name)
            return _original(self, batch)

        monkeypatch.setattr(LlamaContext, name, spy)
    return seen


@pytest.fixture(scope="module")
def two_threads(smollm2_path):
    # two threads: with one, OpenMP makes no team and the fault does not show
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=512, n_threads=2, n_threads_batch=2)) as llama:
        yield llama


def test_embeddings_and_the_warm_up_compute_on_the_engines_thread(two_threads, computing):
    two_threads.create_completion("The capital of France is", max_tokens=2)
    assert computing == {"llamaplug-engine"}
    two_threads.embed(["hello world", "the cat sat on the mat"])
    two_threads.embed(["hello world"], pooling="none")
    two_threads.warm_up()
    assert computing == {"llamaplug-engine"}


def test_rerank_computes_on_the_engines_thread(tmp_path, computing):
    with lp.Llama.load(lp.LlamaParams(write_tiny_reranker(tmp_path / "r.gguf"), n_ctx=128, n_threads=2)) as llama:
        scores = llama.rerank("the world", ["hello world", "a cat"])
        assert len(scores) == 2 and computing == {"llamaplug-engine"}


def _tids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the process's threads in /proc (Linux)")
def test_a_callers_thread_gets_no_openmp_team(two_threads, monkeypatch):
    """The native side of the same: a thread that embeds and warms up starts no OpenMP threads of its own."""
    monkeypatch.setattr(engine_module, "IDLE_EXIT_S", 60.0, raising=False)  # the worker stays while this runs
    two_threads.create_completion("The capital of France is", max_tokens=2)  # the engine's team exists
    go, done, leave = threading.Event(), threading.Event(), threading.Event()

    def caller() -> None:
        go.wait()
        two_threads.embed(["hello world"])
        two_threads.warm_up()
        done.set()
        leave.wait()  # a thread's OpenMP team ends with it: counted while it lives

    thread = threading.Thread(target=caller)
    thread.start()
    try:
        before = _tids()
        go.set()
        assert done.wait(60)
        new = _tids() - before
    finally:
        leave.set()
        thread.join()
    assert not new  # (the old code: one, the caller's team's OpenMP thread)


def test_warm_up_after_a_generation_empties_the_cache_and_changes_nothing(two_threads):
    """warm_up decodes at position 0: after a generation it was a DecodeError (the sequence held tokens)."""
    first = two_threads.create_completion("Once upon a time", max_tokens=8)
    two_threads.warm_up()
    again = two_threads.create_completion("Once upon a time", max_tokens=8)
    assert again.text == first.text and again.timings.cached_tokens == 0


def test_call_gives_the_result_raises_the_error_and_nests(two_threads):
    engine = two_threads.engine
    assert engine.call(lambda: threading.current_thread().name) == "llamaplug-engine"
    assert engine.call(lambda: engine.call(lambda: threading.current_thread().name)) == "llamaplug-engine"
    with pytest.raises(lp.InvalidParameterError, match="texts must be"):
        engine.call(lambda: two_threads.embed([]))
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("the caller's")
    assert engine.call(var.get) == "the caller's"  # the caller's context goes along (its cancellation flag)


def test_a_cancelled_callers_embedding_stops_on_the_engines_thread(two_threads):
    flag = CancelFlag()
    flag.cancel()
    with pytest.raises(RequestCancelledError):
        flag.run(lambda: two_threads.embed(["hello world"] * 4))
    assert two_threads.embed(["hello world"]).shape[0] == 1


def test_after_close_call_runs_on_the_callers_thread(smollm2_path):
    llama = lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=256, n_threads=1))
    llama.create_completion("Hi", max_tokens=1)
    llama.close()
    assert llama.engine.call(threading.get_ident) == threading.get_ident()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the process's threads in /proc (Linux)")
def test_an_idle_engine_ends_its_thread_and_its_openmp_team(smollm2_path, monkeypatch):
    """A second Llama in the process (an embedding model beside the chat one) leaves no team behind once idle:
    its worker ends after IDLE_EXIT_S, and the next request starts another."""
    monkeypatch.setattr(engine_module, "IDLE_EXIT_S", 0.2, raising=False)
    before = _tids()
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=256, n_threads=2, n_threads_batch=2)) as llama:
        stream = llama.create_completion("The capital of France is", max_tokens=4, stream=True)
        first = next(stream).text  # a decode ran, the request still open: its worker cannot idle
        mine = _tids() - before
        assert len(mine) >= 2  # the worker, and the OpenMP thread of its team
        first += "".join(chunk.text for chunk in stream)
        assert _wait_for(lambda: not mine & _tids())
        again = llama.create_completion("The capital of France is", max_tokens=4)
        assert again.text == first
        assert llama.embed(["hello world"]).shape[0] == 1
        assert _wait_for(lambda: not (_tids() - before))


def _wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_call_inside_idle_runs_in_place(two_threads):
    """`idle` holds what the worker needs between steps: a call from inside it must not wait for the worker."""
    with two_threads.engine.idle("test"):
        assert two_threads.engine.call(threading.get_ident) == threading.get_ident()
