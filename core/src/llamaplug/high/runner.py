"""The runner: carries out a step's plan (scheduler.py) on the engine's context.

`run(plan)`:

1. ends the slots whose jobs were cancelled;
2. a slot's media prompt, when the plan has one: libmtmd evaluates it with its own decodes,
   and that is the step;
3. asks the drafter for the guesses the plan has room for (speculative.py's `ask`);
4. builds the batch: each generating slot's next token and its guesses, then the prompt
   chunks (logits only where a prompt ends);
5. decodes it, once (a cancel aborts it between graph nodes; what it wrote is cut), timed for the
   drafter when the batch holds no prompt chunk (what a drafted row costs). With one KV cache for
   every sequence (kv_unified) a full cache is retried after an idle slot gave its cells back
   (`make_room`, one slot at a time, as llama-server), and ends the step's requests when none is left;
6. hands each slot its rows: `Slot.consumed` (a job that asked hears how far its prompt is read:
   `Emitter.progress`), then the output step (output.py) samples the slot's next token and turns
   it into events, or `speculative.verify` for a slot with guesses (the cache is cut after the
   accepted ones).

A plan's rows name their job: a slot whose admission failed, or whose job ended since the plan
was made, is passed over. The engine's edits of its context go through `own` (the engine's epoch).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from ..blocks.batch import LlamaBatch
from ..blocks.context import LlamaContext
from ..errors import ContextOverflowError, DecodeError, KvCacheFullError, LlamaError
from .completion import StopReason
from .output import Emitter
from .scheduler import StepPlan
from .slot import Slot
from .speculative import Drafter, SynthAcceptance, ask, verify
from .stats import EngineStats

_ABORTED = 2  # llama_decode's code when the abort callback stopped it


class Runner:
    """Runs plans on `context` (a batch of n_batch tokens), handing sampled rows to `emitter`."""

    def __init__(self, context: LlamaContext, emitter: Emitter, stats: EngineStats, drafter: Drafter | None,
                 own: Callable[[], contextlib.AbstractContextManager[None]],
                 make_room: Callable[[], bool] = lambda: False, synth: SynthAcceptance | None = None):
        self._ctx = context
        self._synth = synth  # guesses accepted at random (benchmarking only): speculative.SynthAcceptance
        self._make_room = make_room  # an idle slot's cells given back (kv_unified); whether there was one
        self._emitter = emitter
        self._stats = stats
        self._drafter = drafter
        self._own = own
        self._batch = LlamaBatch(context.n_batch, 1)
        self._generating = (0, 0)  # the built batch's (slots, guesses) when it holds no prompt chunk, else (0, 0)

    def run(self, plan: StepPlan) -> None:
        emitter = self._emitter
        for slot in plan.cancel:
            if slot.job is not None:
                emitter.finish(slot, StopReason.CANCELLED)
        if plan.media is not None:
            if plan.media.job is not None:
                self._eval_media(plan.media)
            return
        rows = self._build(plan)
        if not rows:
            return
        ctx = self._ctx
        ctx.clear_abort()
        if any(slot.job is not None and slot.job.cancelled for slot, _ in rows):
            return  # Llama.cancel came after the plan, before the abort flag was cleared: next step
        try:
            with self._own():
                start = time.perf_counter()
                self._decode()
                seconds = time.perf_counter() - start
        except KvCacheFullError as exc:
            self.fail(rows, exc)
            return
        except DecodeError as exc:
            if exc.code != _ABORTED:
                self.fail(rows, exc)
                return
            # Llama.cancel: what the aborted decode wrote is not ours; the cancelled jobs end next step.
            with self._own():
                for slot, _ in rows:
                    ctx.kv_cache_seq_rm(slot.seq, len(slot.tokens), -1)
                    slot.draft = []
            return
        except LlamaError as exc:
            self.fail(rows, exc)
            return
        self._stats.decode_steps += 1
        self._stats.busy_slot_steps += len(rows)
        if self._drafter is not None and self._generating[0]:
            self._drafter.decoded(*self._generating, seconds)
        end = 0  # one past the slot's last token in the batch: its logits row when its prompt is read
        for slot, n in rows:
            end += n
            if slot.draft:
                self._verify(slot, end - n)
                continue
            reading = slot.next is None  # a prompt chunk (a generating slot decoded its next token)
            read = slot.consumed(n)
            if reading and slot.job is not None and slot.job.progress:  # before the token it gives, as llama-server
                emitter.progress(slot)
            if read:
                emitter.output(slot, end - 1)

    def _decode(self) -> None:
        """Decode the built batch. A shared cache (kv_unified) that is full gets an idle slot's cells and the decode
        is tried again (llama_decode's code 1 writes nothing); with no idle cells left, KvCacheFullError."""
        while True:
            try:
                self._ctx.decode(self._batch)
                return
            except ContextOverflowError as exc:
                if not self._ctx.params.kv_unified:
                    raise
                if self._make_room():
                    continue
                ctx = self._ctx
                raise KvCacheFullError(
                    f"Context size has been exceeded: the KV cache the {ctx.n_seq_max} slots share (kv_unified, "
                    f"n_ctx={ctx.n_ctx}) has no room for this step's {self._batch.n_tokens} tokens, and no idle "
                    "slot holds any; every request in the step ends, as llama-server's (fewer requests at once, "
                    "a larger context or smaller max_tokens)") from exc

    def _build(self, plan: StepPlan) -> list[tuple[Slot, int]]:
        """The plan's batch; (slot, how many of its tokens are in the batch), in the batch's order."""
        batch = self._batch
        batch.clear()
        decode = [slot for slot in plan.decode if slot.job is not None and slot.next is not None]
        if self._drafter is not None and plan.drafts:
            ask(self._drafter, [(slot, n) for slot, n in plan.drafts if slot.job is not None and slot.next is not None])
        rows: list[tuple[Slot, int]] = []
        for slot in decode:
            assert slot.next is not None
            batch.add(slot.next, len(slot.tokens), slot.seq, True)
            for i, token in enumerate(slot.draft):
                batch.add(token, len(slot.tokens) + 1 + i, slot.seq, True)
            rows.append((slot, 1 + len(slot.draft)))
        self._generating = (len(rows), batch.n_tokens - len(rows))
        for chunk in plan.prefill:
            slot = chunk.slot
            if slot.job is not chunk.job or not slot.todo:  # its admission failed, or it ended
                continue
            take = slot.todo[:chunk.n]
            batch.add_sequence(take, slot.seq, False, len(slot.tokens))
            if len(take) < len(slot.todo):
                batch.logits[batch.n_tokens - 1] = 0  # logits only where the prompt ends
            rows.append((slot, len(take)))
            self._generating = (0, 0)
        return rows

    def _eval_media(self, slot: Slot) -> None:
        job = slot.job
        assert job is not None
        self._ctx.clear_abort()
        if job.cancelled:
            self._emitter.finish(slot, StopReason.CANCELLED)
            return
        try:
            with self._own():
                n_past = job.media.eval(self._ctx, 0, slot.seq, self._ctx.n_batch, True)
        except LlamaError as exc:
            if job.cancelled:  # Llama.cancel aborted the decode
                with self._own():
                    self._ctx.kv_cache_seq_rm(slot.seq, 0, -1)
                self._emitter.finish(slot, StopReason.CANCELLED)
            else:
                self.fail([(slot, 0)], exc)
            return
        slot.media_read(n_past)  # positions no text prompt can match: no prefix reuse past media
        self._stats.decode_steps += 1
        self._stats.busy_slot_steps += 1
        self._emitter.output(slot, -1)

    def _verify(self, slot: Slot, first: int) -> None:
        verify(slot, first, self._emitter.output, self._stats, self._synth)
        with self._own():
            self._ctx.kv_cache_seq_rm(slot.seq, len(slot.tokens), -1)

    def fail(self, rows: list[tuple[Slot, int]], exc: BaseException) -> None:
        """End the rows' jobs with `exc`; what their sequences hold is unknown, so they are cleared."""
        for slot, _ in rows:
            job = slot.job
            with self._own():
                self._ctx.kv_cache_seq_rm(slot.seq, 0, -1)
            slot.forget()
            self._emitter.release(slot)
            if job is not None:
                self._emitter.end(job, exc)
