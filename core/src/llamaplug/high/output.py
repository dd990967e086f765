"""The engine's output step: what a slot's sampled token becomes for its job.

After the decode the runner (runner.py) hands each row of logits to `Emitter.output`: the
slot samples it and applies the stop rules (`Slot.advance`: the token's text made safe by
the stop-string automaton, its logprobs), and the emitter hands the chunk to the job's sink,
counts it, and ends the job when a stop rule said so, with the last chunk (the text held
back, the reason, the timings). Every end of a job goes through `end`: the job's last event
(a chunk or an error) is sent once, and a sampler it owns is closed. A job that asks for it
hears how far its prompt is read too (`progress`).

A sink runs on the engine's thread (a queue's put, asyncio's call_soon_threadsafe); one that
raises cancels its job, never the step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .completion import CompletionChunk, CompletionTimings, PromptProgress, StopReason
from .job import Job
from .slot import Slot
from .stats import EngineStats

log = logging.getLogger("llamaplug.engine")
_spec_log = logging.getLogger("llamaplug.speculative")  # `serve` shows its lines at its default level


class Emitter:
    """Events for jobs: `stats` counted, `released()` called after a slot is freed (the engine's busy count)."""

    def __init__(self, stats: EngineStats, released: Callable[[], None]):
        self._stats = stats
        self._released = released

    def output(self, slot: Slot, idx: int, forced: int | None = None) -> int | None:
        """Let the slot sample from logits row `idx` and hand what it gave to its job (`forced` in place of the
        sampled token: Slot.advance); the token (None if none)."""
        job = slot.job
        assert job is not None
        out = slot.advance(idx, forced)
        if out.error is not None:
            self.release(slot)
            self.end(job, out.error)
            return None
        if out.token is not None:  # sampled, the end-of-generation token too (llama-server's n_decoded)
            self._stats.generated_tokens += 1
        if out.chunk is not None:
            self.emit(job, out.chunk)
        if out.reason is not None:
            self.finish(slot, out.reason)
        return out.token

    def progress(self, slot: Slot, start: bool = False) -> None:
        """Tell the slot's job how far its prompt is read (Job.progress): at its start (`start`: what the cache
        gave, no time spent reading), then after each batch. Its timings are the prompt's so far, as llama-server's
        on a progress chunk: the tokens read (not the cached) and the time until the last batch."""
        job = slot.job
        assert job is not None
        elapsed = (time.perf_counter() - job.started) * 1e3
        processed = len(slot.tokens)
        self.emit(job, CompletionChunk("", [], timings=CompletionTimings(processed, 0.0 if start else elapsed, 0, 0.0,
                                                                         job.cached),
                                       progress=PromptProgress(job.n_prompt, job.cached, processed, int(elapsed))))

    def finish(self, slot: Slot, reason: StopReason) -> None:
        """End the slot's job with `reason`: the text the stop-string automaton held back, the timings."""
        job = slot.job
        assert job is not None
        if job.drafted:  # llama-server's line at a slot's end
            _spec_log.info("slot %d: draft acceptance = %.5f (%d accepted / %d generated)", slot.seq,
                           job.accepted / job.drafted, job.accepted, job.drafted)
        self.release(slot)
        self.end(job, CompletionChunk(job.text.finish(), [], None, reason, timings(job), job.stop_string))

    def finish_unstarted(self, job: Job) -> None:
        """A job cancelled while it waited: its only event."""
        self.end(job, CompletionChunk("", [], None, StopReason.CANCELLED, timings(job)))

    def release(self, slot: Slot) -> None:
        slot.release()
        self._released()

    def end(self, job: Job, event: CompletionChunk | BaseException) -> None:
        """The job's last event (once: a job already ended hears nothing more)."""
        if job.done:
            return
        job.done = True
        stats = self._stats
        if isinstance(event, BaseException):
            stats.errors += 1
        else:
            stats.finished += 1
            if event.timings is not None:
                t = event.timings
                stats.prompt_ms += t.prompt_ms
                stats.predicted_ms += t.predicted_ms
                stats.n_tokens_max = max(stats.n_tokens_max, t.prompt_tokens + t.predicted_tokens)
        self.emit(job, event)
        if job.own_sampler:
            job.sampler.close()

    def emit(self, job: Job, event: CompletionChunk | BaseException) -> None:
        try:
            job.sink(event)
        except BaseException:  # the consumer is gone (a closed event loop): stop its job
            log.debug("a job's sink failed; cancelling the job", exc_info=True)
            job.cancel()


def timings(job: Job) -> CompletionTimings:
    end = time.perf_counter()
    first = job.first_token or end
    return CompletionTimings(job.n_prompt, (first - job.started) * 1e3, job.produced, (end - first) * 1e3,
                             job.cached, job.drafted, job.accepted, job.shifts)
