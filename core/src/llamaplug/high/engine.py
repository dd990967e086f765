"""The engine: continuous batching of many sequences in one context.

One worker thread owns the context and runs the loop, one step at a time, in three parts
(vLLM's scheduler / runner / output split, over llama-server's slots):

1. plan (scheduler.py's `schedule`, pure: it reads the waiting jobs and the slots): which
   waiting job takes which free slot (the admission policy: arrival order, the slot whose
   tokens share the longest prefix with the prompt first), the running jobs that were
   cancelled, each generating slot's next token and the room for a drafter's guesses
   (speculative.py), and prompt chunks in the room left, so reading a long prompt never
   stalls running streams;
2. the engine admits: `Slot.place` gives each admitted job its slot and reuses the prefix
   the slot (or the host prefix store) holds (slot.py); a failure there fails that job only;
3. run (runner.py): the batch is built and decoded, once, and each slot gets its rows:
   `Slot.consumed`, then the output step (output.py: `Slot.advance` samples the next token
   and applies the stop rules, the chunk goes to the job's sink) or `speculative.verify` for
   a slot with guesses. A job that ended frees its slot at once; the next plan fills it.

With `context_shift` (llama-server's --context-shift), before the plan a generating slot whose next
token would fill its sequence drops half of its tokens after the first (`Slot.shift`), the drafter
told the same (`Drafter.shifted`), and goes on; what the slot may reuse once its request ends is the
part before the shift (`Slot.release`, `Slot.drop_shifted`).

A failure inside a step fails the requests running in it, and the loop goes on; only one with
no request to fail stops the worker (`failure`, `on_stop`).

A slot keeps its tokens after its request ends, so a request whose prompt shares a prefix
with them (the next chat turn, a common system prompt) decodes only the rest:
`CompletionTimings.cached_tokens`.

Where things go: a new stop rule in `Slot.on_token`; a new order of waiting jobs or choice of
slot in an `AdmissionPolicy` (scheduler.py); a new share of the batch between slots in
`schedule`; what a job hears of its tokens in output.py; how a plan is decoded in runner.py.

Callers never touch the context: they hand the engine a `Job` and get its
events through the job's `sink` (a queue's put for threads, a
call_soon_threadsafe for asyncio), on the worker thread.

The worker is also the only thread that computes for this Llama (`call`: the embedding contexts' decodes, the
warm-up, the projector's first encode). The CPU backend's threads are OpenMP's, and OpenMP keeps a team of them
for each thread that ever computed, until that thread ends: once their count passes the cores, every barrier
between graph nodes sleeps instead of spinning (one embedding computed on the caller's thread left this engine's
generation at 0.70x for good, 2 cores, 2 threads). llama-server computes on one thread too. For the same
reason a worker with nothing to do for IDLE_EXIT_S ends, its team with it, and the next job or call starts
another: a second Llama in the process (an embedding model beside the chat one) costs nothing while idle.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TypeVar

from ..blocks.context import LlamaContext
from ..errors import ClosedError, EngineError, InvalidParameterError
from .disk_store import DiskStore, prompt_cache
from .job import Job as Job  # its home was here
from .logprobs import LogprobReader
from .output import Emitter
from .runner import Runner
from .scheduler import FIFO, AdmissionPolicy, Budget, StepPlan, schedule
from .slot import Slot
from .speculative import Drafter, SynthAcceptance
from .stats import EngineStats as EngineStats  # its home was here

log = logging.getLogger("llamaplug.engine")
T = TypeVar("T")
IDLE_EXIT_S = 1.0  # an idle worker ends after this long (see the module); starting one again costs well under 1 ms


class _Call:
    """A function another thread gave the worker (Engine.call), run between two steps in the caller's context
    (its cancellation flag, blocks/cancellation.py, comes along)."""

    def __init__(self, fn: Callable[[], object]):
        self.fn, self.context = fn, contextvars.copy_context()
        self.done = threading.Event()
        self.result: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.context.run(self.fn)
        except BaseException as exc:  # noqa: BLE001 - the caller's to raise, on its own thread
            self.error = exc
        finally:
            self.done.set()


class Engine:
    """Runs the jobs given to `submit` on `context`, n_seq_max of them at a time.

    `cache_bytes` of host memory keep the KV of sequences that left their slot (prefix_store.py). A reused
    prefix is cut to a multiple of `align` (LlamaParams.cache_exact: n_ubatch). `synth_rates` (benchmarking only:
    speculative.synth_rates resolves them): the drafter's guesses are accepted at random at these rates per
    position instead of by the target's samples (speculative.SynthAcceptance), as llama-server's --spec-synth-*.
    `context_shift`: a text request that fills its sequence shifts it and goes on (see the module), where the
    context can shift positions (else a warning, and off, as llama-server).
    """

    def __init__(self, context: LlamaContext, cache_bytes: int = 0, drafter: Drafter | None = None,
                 policy: AdmissionPolicy = FIFO, disk: DiskStore | None = None, align: int = 1,
                 synth_rates: list[float] | None = None, context_shift: bool = False):
        self._ctx = context
        self._drafter = drafter
        if synth_rates and drafter is None:
            raise InvalidParameterError("synthetic acceptance requires an initialized speculative decoding context "
                                        "(a drafter)", field="draft_synth_rates")
        synth = SynthAcceptance(synth_rates, context.model.token_is_eog) if synth_rates else None
        # A sliding-window cache forgets cells behind the window: a prefix is reusable only while the
        # window before its end is still there (llama-server's check).
        n_swa = 0 if context.params.swa_full else context.model.n_swa
        logprobs = LogprobReader(context)
        if context_shift and not context.kv_cache_can_shift:
            log.warning("context shift is not supported by this context (%s); it is off",
                        "a recurrent model" if context.recurrent else "its cache cannot move positions")
            context_shift = False
        self._shift = context_shift
        self._slots = [Slot(i, context, logprobs, n_swa, align, context_shift) for i in range(context.n_seq_max)]
        self._n_ctx_seq = context.n_ctx_seq
        self._policy = policy
        self._budget = Budget(context.n_batch, context.n_outputs_max, drafter.draft_max if drafter else 0)
        self._waiting: deque[Job] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._calls: list[_Call] = []
        self._worker_gone = False  # the worker ended (a close, a failure): `call` runs on the caller's thread
        self._idle_holder: threading.Thread | None = None  # the thread inside `idle` now
        self._closed = False
        self._closing = ClosedError("this Llama was closed while the request ran")  # what running jobs end with
        self._turn = 0  # which prefilling slot goes first, so long prompts share the room fairly
        self._stepping = threading.Lock()  # held by the worker for each step; `idle` takes it between steps
        self._epoch = context.epoch  # the context's epoch after the engine's own last change
        self._failure: BaseException | None = None  # what stopped the worker, if not a close
        self._on_stop: list[Callable[[BaseException], None]] = []
        self.stats = EngineStats()
        self._store = prompt_cache(cache_bytes, disk, self.stats)  # a disk tier under it: disk_store.py
        self._emitter = Emitter(self.stats, self._released)
        self._runner = Runner(context, self._emitter, self.stats, drafter, self._own, self._make_room, synth)

    @property
    def n_slots(self) -> int:
        return len(self._slots)

    @property
    def n_ctx_seq(self) -> int:
        return self._n_ctx_seq

    @property
    def drafter(self) -> Drafter | None:
        return self._drafter

    @property
    def failure(self) -> BaseException | None:
        """What stopped the worker for good (None while it runs, and after a close): a failure it could not
        go on from; every request since ends with ClosedError. A server reloads such a model (registry.py)."""
        return self._failure

    def on_stop(self, hook: Callable[[BaseException], None]) -> None:
        """Call `hook(failure)` when the worker stops for good without a close (see `failure`): on the worker
        thread, before its requests fail (keep it short); at once if it has stopped already."""
        with self._cv:
            self._on_stop.append(hook)
            failure = self._failure
        if failure is not None:
            hook(failure)

    def slots_running(self) -> list[bool]:
        """Whether each slot runs a request now: a snapshot read without a lock (for the server's /slots)."""
        return [slot.job is not None for slot in self._slots]

    def slots_cache(self) -> list[tuple[str, int]]:
        """Each slot's last prompt: where its cached tokens came from ("slot", "ram", "disk", "none") and how
        many there were; a snapshot read without a lock (for the server's /slots)."""
        return [(slot.origin, slot.cached) for slot in self._slots]

    def submit(self, job: Job) -> Job:
        with self._cv:
            if self._closed:
                raise ClosedError("this Llama is closed")
            job.started = time.perf_counter()
            self._waiting.append(job)
            self.stats.requests += 1
            self.stats.waiting = len(self._waiting)
            self._start()
            self._cv.notify()
        return job

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()` run on the worker thread, between two steps, for its result (its exception raised here).

        For native work of this Llama's outside the engine's context (see the module: one thread computes). On
        the worker itself, inside `idle`, or once the worker has ended (a close, a failure), `fn` runs here and now."""
        with self._cv:
            # (a caller inside `idle` holds the lock the worker needs: it would wait for itself)
            here = self._worker_gone or threading.current_thread() in (self._thread, self._idle_holder)
            if not here:
                call = _Call(fn)
                self._calls.append(call)
                self._start()
                self._cv.notify()
        if here:
            return fn()
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    def _start(self) -> None:
        """Start the worker if it has not started (lock held)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="llamaplug-engine", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def cancel_all(self) -> None:
        """Cancel every job submitted so far; a decode running now stops between graph nodes."""
        with self._cv:
            for job in self._waiting:
                job.cancel()
            for slot in self._slots:
                if slot.job is not None:
                    slot.job.cancel()
                    self._ctx.abort()
            self._cv.notify()

    def close(self, error: ClosedError | None = None) -> None:
        """Stop the worker (jobs still running end with `error`, default a ClosedError) and wait for it."""
        with self._cv:
            if error is not None and not self._closed:
                self._closing = error
            self._closed = True
            self._cv.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            self._ctx.abort()
            thread.join()
        if self._store is not None and (thread is None or not thread.is_alive()):  # the disk tier keeps it all
            clean = self._failure is None and self._ctx.epoch == self._epoch
            self._store.close(self._ctx, [(s.seq, s.tokens) for s in self._slots] if clean else [])
        if self._drafter is not None:
            self._drafter.close()

    @contextlib.contextmanager
    def idle(self, why: str, *, forget: bool = False) -> Iterator[list[list[int]]]:
        """Hold the engine between steps, with no request running; yields each slot's tokens (mutable).
        `forget`: the caller changed how the context computes (an adapter's scale), so what the idle slots and
        the prompt cache hold is dropped before the next step instead of taken as the slots' new truth."""
        with self._stepping:
            with self._cv:
                if self._busy() or self._waiting:
                    raise InvalidParameterError(f"{why} needs the engine idle; requests are running or waiting",
                                                field="state")
                self._idle_holder = threading.current_thread()
                try:
                    yield [slot.tokens for slot in self._slots]
                finally:
                    self._idle_holder = None
                if not forget:
                    self._epoch = self._ctx.epoch  # what the caller did (load_state) is the slots' new truth

    # -- the worker ----------------------------------------------------------
    def _run(self) -> None:
        ended = True
        try:
            ended = self._loop()
        finally:
            if ended:
                with self._cv:  # calls given from now on run on their callers' threads; the ones given, here
                    self._worker_gone = True
                    calls, self._calls = self._calls, []
                for call in calls:
                    call.run()

    def _loop(self) -> bool:
        """The worker's loop; False when it ended idle (a later job or call starts another), else True."""
        try:
            while True:
                with self._cv:
                    while not self._has_work():
                        if not self._cv.wait(IDLE_EXIT_S) and not self._has_work():
                            self._thread = None
                            return False
                    if self._closed:
                        break
                    calls, self._calls = self._calls, []
                    stepping = bool(self._waiting) or self._busy()
                for call in calls:
                    call.run()
                if not stepping:
                    continue
                with self._stepping:
                    try:
                        self._forget_if_touched()
                        self._step()
                    except Exception as exc:  # a bug in a step fails the requests it touched, not the engine
                        if not self._fail_running(exc):
                            raise  # none: it was not a request's, and the next step would meet it again
        except BaseException as exc:  # a bug here must not leave callers waiting forever
            log.exception("the engine stopped")
            self._stop(exc)
            return True
        self._fail_all(self._closing)
        return True

    def _has_work(self) -> bool:
        """Whether the worker has something to do: a close, a job, a call (lock held)."""
        return self._closed or bool(self._waiting) or self._busy() or bool(self._calls)

    def _fail_running(self, exc: Exception) -> bool:
        """After a step raised `exc`: end every running request with an EngineError and clear its sequence
        (what the step left there is unknown); whether there was one."""
        failed = [slot for slot in self._slots if slot.job is not None]
        if not failed:
            return False
        log.error("the engine failed a step; its requests fail, the engine goes on", exc_info=exc)
        error = EngineError(f"the engine failed while running this request: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        self._runner.fail([(slot, 0) for slot in failed], error)
        if self._store is not None:  # its bookkeeping may be what failed
            self._store.clear()
            self._count_store()
        return True

    def _stop(self, exc: BaseException) -> None:
        with self._cv:
            self._failure = exc
            hooks = list(self._on_stop)
        for hook in hooks:  # first: a server marks its model down before the requests' errors reach clients
            try:
                hook(exc)
            except Exception:  # noqa: BLE001 - a watcher's failure is its own
                log.exception("an engine-stop hook failed")
        self._fail_all(ClosedError(f"this Llama's engine stopped ({type(exc).__name__}: {exc}); "
                                   "load the model again"))

    def _forget_if_touched(self) -> None:
        """The context was used outside the engine (a decode, a cache edit, an adapter or state change):
        what the idle slots say they hold can no longer be trusted, so nothing of it is reused."""
        if self._ctx.epoch != self._epoch:
            for slot in self._slots:
                if slot.job is None:
                    slot.forget()
            if self._store is not None:
                self._store.clear()
                self._count_store()
            self._epoch = self._ctx.epoch

    @contextlib.contextmanager
    def _own(self) -> Iterator[None]:
        """An edit of the context by the engine itself, taken into its epoch at once: a caller whose job
        just ended may already be changing the context (set_lora), and that change must not pass as ours."""
        in_sync = self._ctx.epoch == self._epoch
        try:
            yield
        finally:
            if in_sync:
                self._epoch = self._ctx.epoch

    def _busy(self) -> bool:
        return any(slot.job is not None for slot in self._slots)

    def _fail_all(self, exc: BaseException) -> None:
        with self._cv:
            self._closed = True
            jobs = list(self._waiting) + [s.job for s in self._slots if s.job is not None]
            self._waiting.clear()
            for slot in self._slots:
                slot.release()
        for job in jobs:
            self._emitter.end(job, exc)

    # -- one step -----------------------------------------------------------------
    def _step(self) -> None:
        """Shift the full slots (context_shift), plan the step (scheduler.py), admit what it admits, and run it
        (runner.py)."""
        if self._shift:
            self._shift_full()
        with self._cv:  # the waiting queue is the callers' too; a job leaves it only for its slot
            plan = schedule(self._waiting, self._slots, self._budget, turn=self._turn, policy=self._policy)
            self._turn = plan.turn
            self._admit(plan)
        self._runner.run(plan)

    def _admit(self, plan: StepPlan) -> None:
        """Drop the jobs cancelled while they waited and give the admitted ones their slots (lock held)."""
        if plan.drop or plan.admit:
            leaving = {id(job) for job in plan.drop} | {id(job) for job, _ in plan.admit}
            self._waiting = deque(job for job in self._waiting if id(job) not in leaving)
        for job in plan.drop:
            self._emitter.finish_unstarted(job)
        for job, slot in plan.admit:
            try:
                with self._own():
                    cached = slot.place(job, self._store)
            except Exception as exc:  # a bug in the admission fails this request, not the engine
                self._fail_admission(slot, job, exc)
                continue
            self.stats.prompt_tokens += job.n_prompt
            self.stats.cached_tokens += cached
            self._count_store()
            if job.progress:  # llama-server's first report, before any batch: what the cache gave
                self._emitter.progress(slot, start=True)
        self.stats.waiting = len(self._waiting)
        self.stats.busy_slots = sum(s.job is not None for s in self._slots)

    def _fail_admission(self, slot: Slot, job: Job, exc: Exception) -> None:
        log.error("the engine failed to admit a request; it fails, the engine goes on", exc_info=exc)
        error = EngineError(f"the engine failed to admit this request: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        with self._own():
            self._ctx.kv_cache_seq_rm(slot.seq, 0, -1)  # what the slot holds now is unknown
        slot.forget()
        slot.release()
        if self._store is not None:  # its bookkeeping may be what failed
            self._store.clear()
        self._emitter.end(job, error)

    def _make_room(self) -> bool:
        """One KV cache for every sequence (kv_unified) is full: the idle slot used longest ago gives its cells
        back (its tokens kept in the host store first, where there is one), as llama-server purges an idle slot;
        whether one had any. Without kv_unified a slot's cells are its own: nothing to take."""
        if not self._ctx.params.kv_unified:
            return False
        idle = [slot for slot in self._slots if slot.job is None and slot.tokens]
        if not idle:
            return False
        slot = min(idle, key=lambda s: s.used)
        log.debug("the shared KV cache is full: slot %d gives back its %d tokens", slot.seq, len(slot.tokens))
        slot.give_back(self._store)
        self._count_store()
        return True

    def _count_store(self) -> None:
        store = self._store
        self.stats.stored_sequences, self.stats.stored_bytes = (len(store), store.size) if store else (0, 0)

    def _shift_full(self) -> None:
        """llama-server's context shift (its pre_decode): each generating slot about to fill its sequence shifts;
        the drafter's own copy of the sequence follows (ModelDrafter) or is dropped."""
        for slot in self._slots:
            if slot.full():
                with self._own():
                    keep, discard = slot.shift()
                if self._drafter is not None:
                    self._drafter.shifted(slot.seq, keep, discard)

    def _released(self) -> None:
        """After a slot was freed: a slot that shifted gives back its cells past what it may reuse (with one cache
        for every sequence they are other slots' room), and the busy count."""
        for slot in self._slots:
            if slot.clean is not None and slot.job is None:
                with self._own():
                    slot.drop_shifted()
        self._count_busy()

    def _count_busy(self) -> None:
        with self._cv:
            self.stats.busy_slots = sum(s.job is not None for s in self._slots)
