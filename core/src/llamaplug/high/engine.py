"""The engine: continuous batching of many sequences in one context.

One worker thread owns the context and runs the loop, one step at a time:

1. admit: waiting jobs take free slots (the slot whose tokens share the longest prefix
   with the prompt first); `Slot.place` reuses that prefix (slot.py);
2. build the batch: the next token of every generating slot first (with a drafter's
   guesses after it, speculative.py), then prompt chunks of newly admitted jobs in what
   room is left, so reading a long prompt never stalls running streams;
3. decode it, once;
4. hand each slot its rows: `Slot.consumed`, then `Slot.advance` samples the slot's next
   token and applies the stop rules (or `speculative.verify` for a slot with guesses);
5. emit: each output's chunk goes to its job's sink; a job that ended frees its slot at
   once, and the next waiting job takes it at the next step.

A slot keeps its tokens after its request ends, so a request whose prompt shares a prefix
with them (the next chat turn, a common system prompt) decodes only the rest:
`CompletionTimings.cached_tokens`.

Where things go: a new stop rule in `Slot.on_token`; a new way to pick the slot or the
order of waiting jobs in `_admit`; a new share of the batch between slots in `_build`.

Callers never touch the context: they hand the engine a `Job` and get its
events through the job's `sink` (a queue's put for threads, a
call_soon_threadsafe for asyncio), on the worker thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from ..blocks.batch import LlamaBatch
from ..blocks.context import LlamaContext
from ..errors import ClosedError, DecodeError, EngineError, InvalidParameterError, LlamaError
from .completion import CompletionChunk, CompletionTimings, StopReason
from .job import Job as Job  # its home was here
from .logprobs import LogprobReader
from .prefix_store import PrefixStore, common_prefix
from .slot import Slot
from .speculative import Drafter, plan_drafts, verify

log = logging.getLogger("llamaplug.engine")

_ABORTED = 2  # llama_decode's code when the abort callback stopped it


@dataclasses.dataclass
class EngineStats:
    """Counters for /metrics and tests (read without a lock: each is one int)."""

    requests: int = 0
    finished: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    stored_sequences: int = 0
    stored_bytes: int = 0
    generated_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    decode_steps: int = 0
    busy_slots: int = 0
    waiting: int = 0


class Engine:
    """Runs the jobs given to `submit` on `context`, n_seq_max of them at a time.

    `cache_bytes` of host memory keep the KV of sequences that left their slot (prefix_store.py).
    """

    def __init__(self, context: LlamaContext, cache_bytes: int = 0, drafter: Drafter | None = None):
        self._ctx = context
        self._drafter = drafter
        self._store = PrefixStore(cache_bytes) if cache_bytes > 0 else None
        # A sliding-window cache forgets cells behind the window: a prefix is reusable only while the
        # window before its end is still there (llama-server's check).
        n_swa = 0 if context.params.swa_full else context.model.n_swa
        logprobs = LogprobReader(context)
        self._slots = [Slot(i, context, logprobs, n_swa) for i in range(context.n_seq_max)]
        self._n_ctx_seq = context.n_ctx_seq
        self._batch = LlamaBatch(context.n_batch, 1)
        self._n_outputs = context.n_outputs_max  # logits rows a batch may ask for
        self._waiting: deque[Job] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._closing = ClosedError("this Llama was closed while the request ran")  # what running jobs end with
        self._turn = 0  # which prefilling slot goes first, so long prompts share the room fairly
        self._stepping = threading.Lock()  # held by the worker for each step; `idle` takes it between steps
        self._epoch = context.epoch  # the context's epoch after the engine's own last change
        self._failure: BaseException | None = None  # what stopped the worker, if not a close
        self._on_stop: list[Callable[[BaseException], None]] = []
        self.stats = EngineStats()

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

    def submit(self, job: Job) -> Job:
        with self._cv:
            if self._closed:
                raise ClosedError("this Llama is closed")
            job.started = time.perf_counter()
            self._waiting.append(job)
            self.stats.requests += 1
            self.stats.waiting = len(self._waiting)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="llamaplug-engine", daemon=True)
                self._thread.start()
            self._cv.notify()
        return job

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
        if self._drafter is not None:
            self._drafter.close()

    @contextlib.contextmanager
    def idle(self, why: str) -> Iterator[list[list[int]]]:
        """Hold the engine between steps, with no request running; yields each slot's tokens (mutable)."""
        with self._stepping:
            with self._cv:
                if self._busy() or self._waiting:
                    raise InvalidParameterError(f"{why} needs the engine idle; requests are running or waiting",
                                                field="state")
                yield [slot.tokens for slot in self._slots]
                self._epoch = self._ctx.epoch  # what the caller did (load_state) is the slots' new truth

    # -- the worker ----------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._closed and not self._waiting and not self._busy():
                        self._cv.wait()
                    if self._closed:
                        break
                with self._stepping:
                    try:
                        self._forget_if_touched()
                        with self._cv:
                            self._admit()
                        self._step()
                    except Exception as exc:  # a bug in a step fails the requests it touched, not the engine
                        if not self._fail_running(exc):
                            raise  # none: it was not a request's, and the next step would meet it again
        except BaseException as exc:  # a bug here must not leave callers waiting forever
            log.exception("the engine stopped")
            self._stop(exc)
            return
        self._fail_all(self._closing)

    def _fail_running(self, exc: Exception) -> bool:
        """After a step raised `exc`: end every running request with an EngineError and clear its sequence
        (what the step left there is unknown); whether there was one."""
        failed = [slot for slot in self._slots if slot.job is not None]
        if not failed:
            return False
        log.error("the engine failed a step; its requests fail, the engine goes on", exc_info=exc)
        error = EngineError(f"the engine failed while running this request: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        self._fail_rows([(slot, 0) for slot in failed], error)
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
            self._end(job, exc)

    # -- admit ------------------------------------------------------------------
    def _admit(self) -> None:
        """Give free slots to waiting jobs (called with the lock held)."""
        while self._waiting:
            job = self._waiting[0]
            if job.cancelled:
                self._waiting.popleft()
                self._finish_unstarted(job)
                continue
            free = [s for s in self._slots if s.job is None]
            if not free:
                break
            self._waiting.popleft()
            slot = max(free, key=lambda s: (common_prefix(s.tokens, job.prompt), -s.used))
            try:
                with self._own():
                    cached = slot.place(job, self._store)
            except Exception as exc:  # a bug in the admission fails this request, not the engine
                self._fail_admission(slot, job, exc)
                continue
            self.stats.prompt_tokens += job.n_prompt
            self.stats.cached_tokens += cached
            self._count_store()
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
        self._end(job, error)

    def _count_store(self) -> None:
        store = self._store
        self.stats.stored_sequences, self.stats.stored_bytes = (len(store), store.size) if store else (0, 0)

    # -- one step -----------------------------------------------------------------
    def _step(self) -> None:
        for slot in self._slots:
            if slot.job is not None and slot.job.media is not None and not slot.tokens and slot.next is None:
                self._eval_media(slot)  # libmtmd runs its own decodes: a step of its own
                return
        rows = self._build()
        if not rows:
            return
        ctx = self._ctx
        ctx.clear_abort()
        if any(slot.job is not None and slot.job.cancelled for slot, _ in rows):
            return  # Llama.cancel came after the checks above, before the abort flag was cleared: next step
        try:
            with self._own():
                ctx.decode(self._batch)
        except DecodeError as exc:
            if exc.code != _ABORTED:
                self._fail_rows(rows, exc)
                return
            # Llama.cancel: what the aborted decode wrote is not ours; the cancelled jobs end next step.
            with self._own():
                for slot, _ in rows:
                    ctx.kv_cache_seq_rm(slot.seq, len(slot.tokens), -1)
                    slot.draft = []
            return
        except LlamaError as exc:
            self._fail_rows(rows, exc)
            return
        self.stats.decode_steps += 1
        end = 0  # one past the slot's last token in the batch: its logits row when its prompt is read
        for slot, n in rows:
            end += n
            if slot.draft:
                self._verify(slot, end - n)
            elif slot.consumed(n):
                self._output(slot, end - 1)

    def _build(self) -> list[tuple[Slot, int]]:
        """This step's batch: each generating slot's next token (and guesses), then prompt chunks in the room
        left; (slot, how many of its tokens are in the batch), in the batch's order."""
        batch = self._batch
        batch.clear()
        for slot in self._slots:
            if slot.job is not None and slot.next is not None and slot.job.cancelled:
                self._finish(slot, StopReason.CANCELLED)
        generating = [s for s in self._slots if s.generating]
        prefilling = [s for s in self._slots if s.job is not None and s.todo]
        if self._drafter is not None:
            plan_drafts(self._drafter, [s for s in generating if s.job is not None and s.job.media is None],
                        batch.capacity - len(generating), self._n_outputs - len(generating) - len(prefilling))
        rows: list[tuple[Slot, int]] = []
        for slot in generating:
            assert slot.next is not None
            batch.add(slot.next, len(slot.tokens), slot.seq, True)
            for i, token in enumerate(slot.draft):
                batch.add(token, len(slot.tokens) + 1 + i, slot.seq, True)
            rows.append((slot, 1 + len(slot.draft)))
        if prefilling:
            self._turn = (self._turn + 1) % len(prefilling)
            prefilling = prefilling[self._turn:] + prefilling[:self._turn]
        for slot in prefilling:
            assert slot.job is not None
            if slot.job.cancelled:
                self._finish(slot, StopReason.CANCELLED)
                continue
            room = batch.capacity - batch.n_tokens
            if room == 0:
                break
            take = slot.todo[:room]
            batch.add_sequence(take, slot.seq, False, len(slot.tokens))
            if len(take) < len(slot.todo):
                batch.logits[batch.n_tokens - 1] = 0  # logits only where the prompt ends
            rows.append((slot, len(take)))
        return rows

    def _eval_media(self, slot: Slot) -> None:
        job = slot.job
        assert job is not None
        if job.cancelled:
            self._finish(slot, StopReason.CANCELLED)
            return
        self._ctx.clear_abort()
        if job.cancelled:
            self._finish(slot, StopReason.CANCELLED)
            return
        try:
            with self._own():
                n_past = job.media.eval(self._ctx, 0, slot.seq, self._ctx.n_batch, True)
        except LlamaError as exc:
            if job.cancelled:  # Llama.cancel aborted the decode
                with self._own():
                    self._ctx.kv_cache_seq_rm(slot.seq, 0, -1)
                self._finish(slot, StopReason.CANCELLED)
            else:
                self._fail_rows([(slot, 0)], exc)
            return
        slot.media_read(n_past)  # positions no text prompt can match: no prefix reuse past media
        self.stats.decode_steps += 1
        self._output(slot, -1)

    def _verify(self, slot: Slot, first: int) -> None:
        job = slot.job
        assert job is not None
        drafted, accepted = job.drafted, job.accepted
        verify(slot, first, self._output)
        self.stats.drafted_tokens += job.drafted - drafted
        self.stats.accepted_tokens += job.accepted - accepted
        with self._own():
            self._ctx.kv_cache_seq_rm(slot.seq, len(slot.tokens), -1)

    # -- emit ---------------------------------------------------------------------
    def _output(self, slot: Slot, idx: int) -> int | None:
        """Let the slot sample from logits row `idx` and hand what it gave to its job; the token (None if none)."""
        job = slot.job
        assert job is not None
        out = slot.advance(idx)
        if out.error is not None:
            self._release(slot)
            self._end(job, out.error)
            return None
        if out.token is not None:  # sampled, the end-of-generation token too (llama-server's n_decoded)
            self.stats.generated_tokens += 1
        if out.chunk is not None:
            self._emit(job, out.chunk)
        if out.reason is not None:
            self._finish(slot, out.reason)
        return out.token

    def _emit(self, job: Job, event: CompletionChunk | BaseException) -> None:
        try:
            job.sink(event)
        except BaseException:  # the consumer is gone (a closed event loop): stop its job
            log.debug("a job's sink failed; cancelling the job", exc_info=True)
            job.cancel()

    def _timings(self, job: Job) -> CompletionTimings:
        end = time.perf_counter()
        first = job.first_token or end
        return CompletionTimings(job.n_prompt, (first - job.started) * 1e3, job.produced, (end - first) * 1e3,
                                 job.cached, job.drafted, job.accepted)

    def _finish(self, slot: Slot, reason: StopReason) -> None:
        job = slot.job
        assert job is not None
        self._release(slot)
        self._end(job, CompletionChunk(job.text.finish(), [], None, reason, self._timings(job), job.stop_string))

    def _finish_unstarted(self, job: Job) -> None:
        self._end(job, CompletionChunk("", [], None, StopReason.CANCELLED, self._timings(job)))

    def _release(self, slot: Slot) -> None:
        slot.release()
        with self._cv:
            self.stats.busy_slots = sum(s.job is not None for s in self._slots)

    def _end(self, job: Job, event: CompletionChunk | BaseException) -> None:
        if job.done:
            return
        job.done = True
        if isinstance(event, BaseException):
            self.stats.errors += 1
        else:
            self.stats.finished += 1
        self._emit(job, event)
        if job.own_sampler:
            job.sampler.close()

    def _fail_rows(self, rows: list[tuple[Slot, int]], exc: LlamaError) -> None:
        for slot, _ in rows:
            job = slot.job
            with self._own():
                self._ctx.kv_cache_seq_rm(slot.seq, 0, -1)  # what the failed decode left is unknown
            slot.forget()
            self._release(slot)
            if job is not None:
                self._end(job, exc)
