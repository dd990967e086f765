"""The engine: continuous batching of many sequences in one context.

One worker thread owns the context. Each step builds one batch: the last sampled
token of every generating sequence first, then prompt chunks of newly admitted
requests in what room is left (so reading a long prompt never stalls running
streams), calls llama_decode once, and samples each sequence's next token from
its own row of logits. A finished sequence frees its slot at once; the next
waiting request takes it at the next step.

A slot (one KV-cache sequence) keeps its tokens after its request ends, so a
request whose prompt shares a prefix with them (the next chat turn, a common
system prompt) decodes only the rest: `CompletionTimings.cached_tokens`.

With a drafter (speculative.py), a generating slot's token goes into the step's batch
with the drafter's guesses after it, every one with logits; the slot's sampler then
samples row after row while its token equals the guess, and the cache is cut after the
last accepted one (`_verify`). Without one, the step is the same as ever.

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
from typing import Any

from ..blocks.batch import LlamaBatch
from ..blocks.context import LlamaContext
from ..blocks.sampling import LlamaSampler
from ..errors import ClosedError, DecodeError, InvalidParameterError, LlamaError
from .completion import CompletionChunk, CompletionTimings, StopReason, TextAssembler
from .logprobs import LogprobReader
from .prefix_store import PrefixStore, common_prefix
from .speculative import Drafter, DraftRequest

log = logging.getLogger("llamaplug.engine")

_MIN_STASH = 8  # fewer tokens about to be cut are not worth a copy of the sequence
_ABORTED = 2  # llama_decode's code when the abort callback stopped it


@dataclasses.dataclass(eq=False)
class Job:
    """One request: a prompt to continue, and where its events go."""

    prompt: list[int]
    max_tokens: int | None
    sampler: LlamaSampler
    stops: list[str]
    n_logprobs: int | None = None
    own_sampler: bool = False
    sink: Callable[[CompletionChunk | BaseException], None] = print
    media: Any = None  # an MtmdInputChunks (plugin llamaplug-mtmd) in place of `prompt`'s tokens
    # Special tokens whose text the reply keeps (the chat layer's preserved tokens: a template's <tool_call>).
    render_special: frozenset[int] = frozenset()
    cancelled: bool = False
    done: bool = False
    # Filled in while it runs.
    text: TextAssembler = dataclasses.field(init=False)
    produced: int = 0
    cached: int = 0
    started: float = 0.0
    first_token: float = 0.0
    drafted: int = 0
    accepted: int = 0

    def __post_init__(self) -> None:
        self.text = TextAssembler(self.stops)

    def cancel(self) -> None:
        """Stop at the next step (from any thread): the last event says StopReason.CANCELLED."""
        self.cancelled = True

    @property
    def n_prompt(self) -> int:
        """Positions the prompt takes (media included)."""
        return len(self.prompt) if self.media is None else int(self.media.n_pos)


@dataclasses.dataclass(eq=False)
class _Slot:
    seq: int
    tokens: list[int] = dataclasses.field(default_factory=list)  # in the KV cache at positions 0..n-1
    job: Job | None = None
    todo: list[int] = dataclasses.field(default_factory=list)  # prompt tokens not decoded yet
    next: int | None = None  # the sampled token to decode next
    used: float = 0.0
    draft: list[int] = dataclasses.field(default_factory=list)  # guesses decoded after `next` this step


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
        self._n_swa = 0 if context.params.swa_full else context.model.n_swa
        self._slots = [_Slot(i) for i in range(context.n_seq_max)]
        self._n_ctx_seq = context.n_ctx_seq
        self._batch = LlamaBatch(context.n_batch, 1)
        self._logprobs = LogprobReader(context)
        self._waiting: deque[Job] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._turn = 0  # which prefilling slot goes first, so long prompts share the room fairly
        self._stepping = threading.Lock()  # held by the worker for each step; `idle` takes it between steps
        self._epoch = context.epoch  # the context's epoch after the engine's own last change
        self.stats = EngineStats()

    @property
    def n_slots(self) -> int:
        return len(self._slots)

    @property
    def n_ctx_seq(self) -> int:
        return self._n_ctx_seq

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

    def close(self) -> None:
        """Stop the worker (jobs still running end with ClosedError) and wait for it."""
        with self._cv:
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
                    self._forget_if_touched()
                    with self._cv:
                        self._admit()
                    self._step()
        except BaseException as exc:  # a bug here must not leave callers waiting forever
            log.exception("the engine stopped")
            self._fail_all(exc)
            return
        self._fail_all(ClosedError("this Llama was closed while the request ran"))

    def _forget_if_touched(self) -> None:
        """The context was used outside the engine (a decode, a cache edit, an adapter or state change):
        what the idle slots say they hold can no longer be trusted, so nothing of it is reused."""
        if self._ctx.epoch != self._epoch:
            for slot in self._slots:
                if slot.job is None:
                    slot.tokens.clear()
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
                slot.job = None
        for job in jobs:
            self._end(job, exc)

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
            self._place(job, slot)
        self.stats.waiting = len(self._waiting)
        self.stats.busy_slots = sum(s.job is not None for s in self._slots)

    def _place(self, job: Job, slot: _Slot) -> None:
        # The last prompt token is decoded again for its logits; a prompt with media is evaluated whole.
        keep = 0 if job.media is not None else min(common_prefix(slot.tokens, job.prompt), len(job.prompt) - 1)
        hit: tuple[tuple[int, ...], int] | None = None  # a stored sequence sharing more than the slot
        if self._store is not None and job.media is None:
            key, n = self._store.best(job.prompt)
            n = min(n, len(job.prompt) - 1)
            if n > keep:
                hit = key, n
        with self._own():
            self._stash(slot, 0 if hit else keep)
            if hit:
                keep = self._restore(slot, *hit)
            # Always cut (not only past the known tokens): after a failed decode or state load the
            # cache may hold cells this bookkeeping does not know of.
            if not self._ctx.kv_cache_seq_rm(slot.seq, keep, -1) or not self._window_kept(slot, keep):
                keep = 0  # a recurrent model cannot cut its state, a sliding window lost cells: start over
                self._ctx.kv_cache_seq_rm(slot.seq, 0, -1)
        del slot.tokens[keep:]
        slot.job, slot.todo, slot.next = job, job.prompt[keep:] if job.media is None else [], None
        job.cached = keep
        self.stats.prompt_tokens += job.n_prompt
        self.stats.cached_tokens += keep

    def _window_kept(self, slot: _Slot, keep: int) -> bool:
        if not self._n_swa or keep == 0:
            return True
        # -1: the cut took every cell the window layers still had
        return 0 <= self._ctx.kv_cache_seq_pos_min(slot.seq) <= max(0, keep - self._n_swa)

    def _stash(self, slot: _Slot, keep: int) -> None:
        """Keep the slot's sequence in the store when a new request is about to cut most of it away."""
        store, tokens = self._store, slot.tokens
        if store is None or len(tokens) - keep < _MIN_STASH or min(tokens) < 0 or store.covers(tokens):
            return  # (negative: media positions, which no text prompt can match)
        try:
            store.put(tokens, self._ctx.state_seq_get(slot.seq))
        except LlamaError:
            log.debug("could not keep sequence %d", slot.seq, exc_info=True)
        self._count_store()

    def _restore(self, slot: _Slot, key: tuple[int, ...], n: int) -> int:
        """Load a stored sequence into the slot; the `n` prompt tokens it gives, 0 if it failed."""
        assert self._store is not None
        try:
            self._ctx.state_seq_set(self._store.get(key), slot.seq)
        except LlamaError:
            log.debug("could not restore a stored sequence into slot %d", slot.seq, exc_info=True)
            self._ctx.kv_cache_seq_rm(slot.seq, 0, -1)
            slot.tokens.clear()
            return 0
        slot.tokens[:] = key
        return n

    def _count_store(self) -> None:
        store = self._store
        self.stats.stored_sequences, self.stats.stored_bytes = (len(store), store.size) if store else (0, 0)

    def _step(self) -> None:
        batch, ctx = self._batch, self._ctx
        for slot in self._slots:
            if slot.job is not None and slot.job.media is not None and not slot.tokens and slot.next is None:
                self._eval_media(slot)  # libmtmd runs its own decodes: a step of its own
                return
        if self._drafter is not None:
            self._draft()
        batch.clear()
        rows: list[tuple[_Slot, int]] = []  # (slot, how many of its tokens are in the batch)
        for slot in self._slots:
            job = slot.job
            if job is None or slot.next is None:
                continue
            if job.cancelled:
                self._finish(slot, StopReason.CANCELLED)  # (_release drops the slot's guesses)
                continue
            batch.add(slot.next, len(slot.tokens), slot.seq, True)
            if slot.draft:
                pos = len(slot.tokens) + 1
                for i, token in enumerate(slot.draft):
                    batch.add(token, pos + i, slot.seq, True)
                rows.append((slot, 1 + len(slot.draft)))
            else:
                rows.append((slot, 1))
        prefilling = [s for s in self._slots if s.job is not None and s.todo]
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
        if not rows:
            return
        ctx.clear_abort()
        if any(slot.job is not None and slot.job.cancelled for slot, _ in rows):
            return  # Llama.cancel came after the checks above, before the abort flag was cleared: next step
        try:
            with self._own():
                ctx.decode(batch)
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
        now = time.perf_counter()
        end = 0  # one past the slot's last token in the batch: its logits row when its prompt is read
        for slot, n in rows:
            end += n
            if slot.draft:
                self._verify(slot, end - n)
                slot.used = now
                continue
            if slot.next is not None:
                slot.tokens.append(slot.next)
                slot.next = None
            else:
                slot.tokens.extend(slot.todo[:n])
                del slot.todo[:n]
            slot.used = now
            if not slot.todo:
                self._after_output(slot, end - 1)

    def _eval_media(self, slot: _Slot) -> None:
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
        slot.tokens = [-1] * n_past  # positions no text prompt can match: no prefix reuse past media
        slot.used = time.perf_counter()
        self.stats.decode_steps += 1
        self._after_output(slot, -1)

    def _limit(self, job: Job) -> int:
        """The tokens `job` may generate: its max_tokens, else what its slot has room for."""
        return job.max_tokens if job.max_tokens is not None else self._n_ctx_seq - job.n_prompt

    def _after_output(self, slot: _Slot, idx: int) -> int | None:
        """Sample the slot's next token from logits row `idx` and hand it to the job; the token (None if none)."""
        job = slot.job
        assert job is not None
        limit = self._limit(job)
        if job.produced >= limit:  # max_tokens=0: the prompt is read, nothing generated
            self._finish(slot, StopReason.MAX_TOKENS if job.max_tokens is not None else StopReason.CONTEXT_FULL)
            return None
        try:
            token = job.sampler.sample(self._ctx, idx)
            lp = [self._logprobs.read(token, job.n_logprobs, idx)] if job.n_logprobs is not None else None
        except Exception as exc:  # noqa: BLE001 - a job's own sampler (a plugin's Python code too) fails that job only
            self._release(slot)
            self._end(job, exc)
            return None
        if not job.first_token:
            job.first_token = time.perf_counter()
        model = self._ctx.model
        if model.token_is_eog(token):
            self._finish(slot, StopReason.EOS)
            return token
        job.produced += 1
        self.stats.generated_tokens += 1
        new = job.text.feed(model.token_to_piece(token, token in job.render_special))
        reason = None
        if job.text.stopped:
            reason = StopReason.STOP_SEQUENCE
        elif job.produced >= limit:
            reason = StopReason.MAX_TOKENS if job.max_tokens is not None else StopReason.CONTEXT_FULL
        elif len(slot.tokens) >= self._n_ctx_seq:
            reason = StopReason.CONTEXT_FULL
        self._emit(job, CompletionChunk(new, [token], lp))
        if reason is not None:
            self._finish(slot, reason)
        else:
            slot.next = token
        return token

    # -- speculative decoding --------------------------------------------------
    def _draft(self) -> None:
        """Ask the drafter for guesses after each generating slot's next token; they go in this step's batch."""
        assert self._drafter is not None
        slots = [s for s in self._slots if s.job is not None and s.next is not None and not s.job.cancelled
                 and s.job.media is None]
        if not slots:
            return
        # The guesses share the batch with the generating tokens and leave prompt chunks what remains.
        share = (self._batch.capacity - len(slots)) // len(slots)
        requests, asking = [], []
        for slot in slots:
            job, last = slot.job, slot.next
            assert job is not None and last is not None
            limit = self._limit(job)
            # As llama.cpp: room for the next token and one sampled after the last guess.
            n_max = min(share, self._n_ctx_seq - len(slot.tokens) - 2, limit - job.produced - 1)
            if n_max > 0:
                requests.append(DraftRequest(slot.seq, slot.tokens, last, n_max))
                asking.append(slot)
        if requests:
            for slot, request, guess in zip(asking, requests, self._drafter.draft(requests)):
                slot.draft = list(guess[:request.n_max])

    def _verify(self, slot: _Slot, first: int) -> None:
        """Sample the rows of the slot's next token and its guesses while the samples equal the guesses
        (llama.cpp's common_sampler_sample_and_accept_n); cut the cache after the last token kept."""
        job = slot.job
        assert job is not None and slot.next is not None
        draft, slot.draft = slot.draft, []
        slot.tokens.append(slot.next)
        slot.next = None
        job.drafted += len(draft)
        self.stats.drafted_tokens += len(draft)
        for i, guess in enumerate(draft):
            token = self._after_output(slot, first + i)
            if token != guess:
                break
            job.accepted += 1
            self.stats.accepted_tokens += 1
            if slot.job is not job:  # it ended on this token (EOS, a stop, max_tokens)
                break
            slot.tokens.append(guess)
            slot.next = None
        else:
            self._after_output(slot, first + len(draft))
        with self._own():
            self._ctx.kv_cache_seq_rm(slot.seq, len(slot.tokens), -1)

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

    def _finish(self, slot: _Slot, reason: StopReason) -> None:
        job = slot.job
        assert job is not None
        self._release(slot)
        self._end(job, CompletionChunk(job.text.finish(), [], None, reason, self._timings(job)))

    def _finish_unstarted(self, job: Job) -> None:
        self._end(job, CompletionChunk("", [], None, StopReason.CANCELLED, self._timings(job)))

    def _release(self, slot: _Slot) -> None:
        slot.job, slot.todo, slot.next, slot.draft = None, [], None, []
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

    def _fail_rows(self, rows: list[tuple[_Slot, int]], exc: LlamaError) -> None:
        for slot, _ in rows:
            job = slot.job
            with self._own():
                self._ctx.kv_cache_seq_rm(slot.seq, 0, -1)  # what the failed decode left is unknown
            slot.tokens.clear()
            self._release(slot)
            if job is not None:
                self._end(job, exc)

