"""The engine never dies from a request (issue 43, part 1).

QA: `serve --cache-ram 8`, then 40 sequential short chats, twice: the engine stopped with a KeyError in
PrefixStore.get (Slot.place picked a stored sequence, then stashed the slot's own one, whose put evicted
the picked one past the byte limit), and every later request was a 503 while /health said 200. Here: that
order, the loop itself (a step or an admission that raises fails its requests, not the engine), the
server loading a model again whose engine did stop (/health 503 meanwhile), a state machine over request
mixes and small caches, and QA's server run.
"""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from llamaplug_testing import THREADS, llamaplug_server, post_json

import llamaplug as lp
from llamaplug.high.engine import Engine
from llamaplug.high.prefix_store import PrefixStore
from llamaplug.high.slot import Slot
from llamaplug.server.app import create_app_for
from llamaplug.server.model_specs import ModelSpec
from llamaplug.server.registry import ModelRegistry, load_warm

N_CTX_SEQ = 256
# Two families of prompts sharing long prefixes, so the store holds entries that later prompts match further
# than the slot they land on does (the order that lost a key).
STEMS = ["Minutes of the chess club. The members studied the Sicilian defence. Item",
         "A recipe for bread: flour, water, salt and yeast. Knead the dough. Step"]


def fresh(path, **options) -> lp.Llama:
    return lp.Llama.load(lp.LlamaParams(path, n_threads=THREADS, **options))


@pytest.fixture(scope="module")
def reference(smollm2_path):
    """No store, one slot: what every prompt must give, whatever the store did."""
    with fresh(smollm2_path, n_ctx=N_CTX_SEQ, cache_ram_mib=0) as llama:
        cache: dict[str, str] = {}

        def text(prompt: str, max_tokens: int) -> str:
            if (prompt, max_tokens) not in cache:
                cache[prompt, max_tokens] = llama.create_completion(prompt, max_tokens=max_tokens).text
            return cache[prompt, max_tokens]

        yield text


# -- the prefix store's order -----------------------------------------------------------------------------
def test_a_stored_sequence_evicted_by_the_slots_own_stash_is_still_restored(smollm2_path, reference):
    """One slot, a 1 MiB store that holds one of these sequences but not two. A runs, then B (A is stashed),
    then C, which shares A's prefix: the store's best is A, and stashing B (the slot's own) evicts A. The old
    order then looked A up and stopped the engine with a KeyError; now A's bytes are taken first."""
    a = STEMS[0] + " one: the opening moves."
    b = STEMS[1] + " one: mix the flour."
    c = STEMS[0] + " two: the endgame."
    with fresh(smollm2_path, n_ctx=N_CTX_SEQ, cache_ram_mib=1) as llama:
        llama.create_completion(a, max_tokens=4)
        llama.create_completion(b, max_tokens=4)
        stats = llama.engine.stats
        assert stats.stored_sequences == 1  # A
        per_sequence = stats.stored_bytes
        assert per_sequence <= 1 << 20 < 2 * per_sequence  # the store cannot hold A and B: B's put evicts A
        got = answered(lambda: llama.create_completion(c, max_tokens=4))  # the old order: C never answered
        assert got.text == reference(c, 4)
        assert got.timings.cached_tokens > len(llama.tokenize(STEMS[0])) - 2  # A's prefix came back
        assert llama.engine.slots_cache() == [("ram", got.timings.cached_tokens)]  # from the store's RAM tier
        assert llama.engine.failure is None
        assert stats.stored_sequences == 1  # B (A left the store for the slot)
        assert llama.create_completion(b, max_tokens=4).text == reference(b, 4)


def answered(call, timeout: float = 120):
    """call() in a thread: its result, or TimeoutError if it never answers (the old engine lost the request it
    was admitting when it stopped)."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)  # daemon: one that never answers cannot hold the exit
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no answer in {timeout} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_the_store_answers_none_for_a_key_it_no_longer_holds():
    store = PrefixStore(10)
    store.put([1, 2, 3], b"x" * 6)
    key, n = store.best([1, 2, 3, 4])
    assert (key, n) == ((1, 2, 3), 3)
    store.put([7, 8, 9], b"y" * 6)  # past the limit: the least recently used, (1, 2, 3), goes
    assert store.get(key) is None and len(store) == 1 and store.size == 6


# -- the loop ---------------------------------------------------------------------------------------------
def failing_once(real, exc: BaseException, when=lambda: True):
    """A method that raises `exc` on its first call where `when()` holds, then is `real` (a function: it binds as
    a method)."""
    raised = []

    def method(*args, **kwargs):
        if not raised and when():
            raised.append(1)
            raise exc
        return real(*args, **kwargs)

    return method


def test_an_admission_that_raises_fails_its_request_only(smollm2_path, reference, monkeypatch):
    with fresh(smollm2_path, n_ctx=2 * N_CTX_SEQ, n_seq_max=2) as llama:
        monkeypatch.setattr(Slot, "place", failing_once(Slot.place, KeyError("planted")))
        with pytest.raises(lp.EngineError, match="admit this request: KeyError") as caught:
            llama.create_completion(STEMS[0], max_tokens=4)
        assert isinstance(caught.value.__cause__, KeyError)
        assert llama.engine.failure is None
        got = llama.create_completions(STEMS, max_tokens=4)
        assert [g.text for g in got] == [reference(p, 4) for p in STEMS]


def test_a_step_that_raises_fails_the_running_requests_and_the_engine_goes_on(smollm2_path, reference,
                                                                             monkeypatch):
    with fresh(smollm2_path, n_ctx=2 * N_CTX_SEQ, n_seq_max=2) as llama:
        # planted in a step where both requests run (the second may be admitted a step after the first)
        monkeypatch.setattr(Slot, "advance", failing_once(Slot.advance, RuntimeError("planted"),
                                                          when=lambda: all(llama.engine.slots_running())))
        with pytest.raises(lp.EngineError, match="running this request: RuntimeError: planted"):
            llama.create_completions(STEMS, max_tokens=4)
        # the caller hears of the first request's end; the second's comes in the same step, a moment later
        deadline = time.monotonic() + 60
        while llama.engine.stats.busy_slots and time.monotonic() < deadline:
            time.sleep(0.05)
        assert llama.engine.failure is None and llama.engine.stats.busy_slots == 0
        assert llama.engine.stats.errors == 2  # both were running in that step
        got = llama.create_completions(STEMS, max_tokens=4)
        assert [g.text for g in got] == [reference(p, 4) for p in STEMS]


def test_a_failure_with_no_request_to_fail_stops_the_engine_and_says_so(smollm2_path, monkeypatch):
    """A step that raises before any request runs would raise again at the next: the engine stops (the only
    way it does), its waiting requests fail at once, and `failure` and the on_stop hooks tell."""
    stopped: list[BaseException] = []
    with fresh(smollm2_path, n_ctx=N_CTX_SEQ) as llama:
        llama.engine.on_stop(stopped.append)
        planted = failing_once(Engine._forget_if_touched, RuntimeError("planted"))
        monkeypatch.setattr(Engine, "_forget_if_touched", planted)
        with pytest.raises(lp.ClosedError, match="engine stopped"):
            llama.create_completion("Hi", max_tokens=2)
        assert isinstance(llama.engine.failure, RuntimeError) and stopped == [llama.engine.failure]
        with pytest.raises(lp.ClosedError):
            llama.create_completion("Hi", max_tokens=2)
        late: list[BaseException] = []
        llama.engine.on_stop(late.append)  # a hook added after the stop hears of it at once
        assert late == stopped


# -- the server -------------------------------------------------------------------------------------------
def test_a_server_loads_a_model_whose_engine_stopped_again_and_health_says_503_meanwhile(smollm2_path,
                                                                                          monkeypatch):
    gate = threading.Event()
    loads: list[lp.Llama] = []

    def loader(params: lp.LlamaParams) -> lp.Llama:
        if loads:  # the reload waits until the test has seen /health while it is down
            assert gate.wait(60)
        loads.append(load_warm(params))
        return loads[-1]

    registry = ModelRegistry(specs=[ModelSpec("m", lp.LlamaParams(smollm2_path, n_ctx=N_CTX_SEQ,
                                                                  n_threads=THREADS))], loader=loader)
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    with TestClient(create_app_for(registry)) as client:
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        assert client.get("/health").status_code == 200
        planted = failing_once(Engine._forget_if_touched, RuntimeError("planted"))
        monkeypatch.setattr(Engine, "_forget_if_touched", planted)
        failed = client.post("/v1/chat/completions", json=chat)
        assert failed.status_code == 503 and "engine stopped" in failed.json()["error"]["message"]
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "model_reloading"
        gate.set()
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the model was not loaded again"
            time.sleep(0.05)
        assert len(loads) == 2 and loads[1] is not loads[0]
        again = client.post("/v1/chat/completions", json=chat)
        assert again.status_code == 200 and again.json()["choices"][0]["message"]["content"]
        assert client.get("/v1/models").json()["data"][0]["status"]["value"] == "loaded"


@pytest.mark.slow
def test_forty_sequential_chats_twice_with_a_small_cache_all_answer(smollm2_path):
    """QA's run, on `llamaplug serve -m SmolLM2 --cache-ram 8` (one request never answered, then every one was
    a 503): every request answers, and /health stays 200."""
    with llamaplug_server(smollm2_path, "--cache-ram", "8") as (port, _):
        for _round in range(2):
            for n in range(40):
                reply = post_json(port, "/v1/chat/completions", {
                    "messages": [{"role": "user", "content": f"Tell me a long story number {n}"}],
                    "max_tokens": 4})
                assert reply["choices"][0]["finish_reason"] in ("length", "stop"), reply
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
            assert resp.status == 200


# -- the state machine ------------------------------------------------------------------------------------
PROMPTS = st.builds(lambda stem, n, tail: f"{STEMS[stem]} {n}:" + " and more" * tail,
                    st.integers(0, len(STEMS) - 1), st.integers(0, 30), st.integers(0, 12))


class RequestMixes(RuleBasedStateMachine):
    """Requests of shared prefixes and different lengths, some cancelled, on engines of 1-3 slots and stores of
    1-2 MiB (a few sequences): every request ends, greedy ones with the store-less reference's text, and the
    engine never stops."""

    smollm2_path = None
    reference = None

    @initialize(slots=st.integers(1, 3), cache=st.integers(1, 2))
    def load(self, slots: int, cache: int) -> None:
        self.llama = fresh(self.smollm2_path, n_ctx=slots * N_CTX_SEQ, n_seq_max=slots, cache_ram_mib=cache)

    def teardown(self) -> None:
        if hasattr(self, "llama"):
            self.llama.close()

    @rule(prompts=st.lists(PROMPTS, min_size=1, max_size=4), max_tokens=st.integers(1, 4))
    def run_together(self, prompts: list[str], max_tokens: int) -> None:
        got = self.llama.create_completions(prompts, max_tokens=max_tokens)
        assert [g.text for g in got] == [self.reference(p, max_tokens) for p in prompts]

    @rule(prompt=PROMPTS, others=st.lists(PROMPTS, max_size=2))
    def cancel_one(self, prompt: str, others: list[str]) -> None:
        done: list[lp.Completion] = []
        ends = threading.Thread(target=lambda: done.extend(self.llama.create_completions(others, max_tokens=3)))
        ends.start()
        stream = self.llama.create_completion(prompt, max_tokens=64, stream=True)
        next(stream)
        stream.close()  # leaving a stream cancels its request
        ends.join(60)
        assert not ends.is_alive() and len(done) == len(others)

    @invariant()
    def engine_runs(self) -> None:
        if hasattr(self, "llama"):
            assert self.llama.engine.failure is None
            assert self.llama.engine.stats.stored_bytes <= self.llama.params.cache_ram_mib << 20


def test_request_mixes_on_small_caches_never_stop_the_engine(smollm2_path, reference):
    RequestMixes.smollm2_path = smollm2_path
    RequestMixes.reference = staticmethod(reference)
    run = RequestMixes.TestCase
    # Derandomized: the same mixes every run. 57 s wall on 2 cores shared with other runs (load 7-10).
    run.settings = settings(max_examples=5, stateful_step_count=6, deadline=None, database=None, derandomize=True,
                            suppress_health_check=list(HealthCheck))
    run().runTest()
