"""A slot: one KV-cache sequence of the engine's context, and the request running on it.

A slot owns its sequence's bookkeeping from the request's start to its end:

- `place`: a new job takes the slot. The tokens the slot already holds that start the
  prompt stay in the cache (prefix reuse); when the host prefix store holds a longer
  match, the slot's own sequence is stashed there and the stored one restored.
- `consumed`: the engine decoded the slot's tokens of this step's batch.
- `advance`: the slot samples its next token from a row of the step's logits and
  applies the stop rules (`on_token`); the `Output` says what the engine hands on.
- `shift`: the sequence is full (LlamaParams.context_shift): half of its tokens after the first
  `keep` are dropped and the rest moved down, as llama-server's context shift.
- `release`: the request is over; the tokens stay, for the next prompt to reuse (with one cache for
  every sequence, until a running one needs the cells: `give_back`). After a shift only the first
  `keep` stay: the moved cells hold what the dropped tokens made of them, not what reading the tokens
  they follow would (`drop_shifted` cuts them).

The engine (engine.py) owns the loop and the context's epoch; it calls `place`, its runner
(runner.py) and output step (output.py) the rest, with their edits of the context marked as
the engine's own. The scheduler (scheduler.py) only reads a slot's bookkeeping.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

from ..blocks.context import LlamaContext
from ..errors import LlamaError
from .completion import CompletionChunk, StopReason
from .job import Job
from .logprobs import LogprobReader
from .prefix_store import PrefixStore, common_prefix

log = logging.getLogger("llamaplug.engine")

_MIN_STASH = 8  # fewer tokens about to be cut are not worth a copy of the sequence
_UNBOUNDED = 2**31 - 1  # a job's limit with context shift and no max_tokens (llama.cpp's n_predict is an int32)


class Output(NamedTuple):  # (a tuple: one is made per generated token)
    """What one row of logits gave a slot: the token sampled (None: none), the chunk for the job's sink (None:
    nothing to hand on), the reason the job ends with (None: it goes on), or the error that ends it."""

    token: int | None = None
    chunk: CompletionChunk | None = None
    reason: StopReason | None = None
    error: BaseException | None = None


class Slot:
    """Sequence `seq` of `context`: the tokens in its KV cache (positions 0..n-1) and the job running on it."""

    def __init__(self, seq: int, context: LlamaContext, logprobs: LogprobReader, n_swa: int = 0, align: int = 1,
                 shift: bool = False):
        self.seq = seq
        self.tokens: list[int] = []
        self.job: Job | None = None
        self.todo: list[int] = []  # prompt tokens not decoded yet
        self.next: int | None = None  # the sampled token to decode next
        self.draft: list[int] = []  # guesses decoded after `next` this step (speculative.py)
        self.used = 0.0
        # where the last prompt's cached tokens came from: "slot" (its own KV), "ram" or "disk" (the store's
        # tiers), "none"; /slots shows it
        self.origin, self.cached = "none", 0
        self._ctx = context
        self._logprobs = logprobs
        self._n_swa = n_swa  # a sliding window's size: a prefix is reusable while the window before its end is kept
        # A reused prefix ends on a multiple of this (n_ubatch: the prompt's rest is then read in the ubatches a
        # cold read uses, so llama.cpp rounds it the same way; 1: anywhere)
        self._align = align
        self._n_ctx_seq = context.n_ctx_seq
        self._store: PrefixStore | None = None
        self._shift = shift  # a full sequence shifts instead of ending its text request (LlamaParams.context_shift)
        self.clean: int | None = None  # after a shift: how many leading tokens still hold what reading them gives

    # -- place ------------------------------------------------------------------
    def place(self, job: Job, store: PrefixStore | None) -> int:
        """Give the slot to `job`; the prompt tokens found in the cache (not decoded again)."""
        # The last prompt token is decoded again for its logits; a prompt with media is evaluated whole.
        keep = 0 if job.media is not None else min(common_prefix(self.tokens, job.prompt), len(job.prompt) - 1)
        keep -= keep % self._align
        hit: tuple[tuple[int, ...], bytes, int] | None = None  # a stored sequence sharing more than the slot
        if store is not None and job.media is None:
            key, n = store.best(job.prompt)
            n = min(n, len(job.prompt) - 1)
            n -= n % self._align
            data = store.get(key) if n > keep else None
            if data is not None:  # taken before the stash: its put may evict `key` (LRU, past the limit)
                hit = key, data, n
        origin = "slot" if keep else "none"
        if store is not None:
            self._stash(store, 0 if hit else keep)
            if hit:
                keep = self._restore(*hit)
                origin = store.origin(hit[0]) if keep else "none"
                if not keep:
                    store.refused(hit[0])
        self._store = store
        ctx = self._ctx
        # Always cut (not only past the known tokens): after a failed decode or state load the
        # cache may hold cells this bookkeeping does not know of.
        if not ctx.kv_cache_seq_rm(self.seq, keep, -1) or not self._window_kept(keep):
            keep = 0  # a recurrent model cannot cut its state, a sliding window lost cells: start over
            ctx.kv_cache_seq_rm(self.seq, 0, -1)
            origin = "none"
        del self.tokens[keep:]
        self.clean = None
        self.job, self.todo, self.next = job, job.prompt[keep:] if job.media is None else [], None
        job.cached = keep
        self.origin, self.cached = origin, keep
        return keep

    def _window_kept(self, keep: int) -> bool:
        if not self._n_swa or keep == 0:
            return True
        # -1: the cut took every cell the window layers still had
        return 0 <= self._ctx.kv_cache_seq_pos_min(self.seq) <= max(0, keep - self._n_swa)

    def _stash(self, store: PrefixStore, keep: int) -> None:
        """Keep the sequence in the store when a new request is about to cut most of it away."""
        tokens = self.tokens
        if len(tokens) - keep < _MIN_STASH or min(tokens) < 0 or store.covers(tokens):
            return  # (negative: media positions, which no text prompt can match)
        try:
            store.put(tokens, self._ctx.state_seq_get(self.seq))
        except LlamaError:
            log.debug("could not keep sequence %d", self.seq, exc_info=True)

    def _restore(self, key: tuple[int, ...], data: bytes, n: int) -> int:
        """Load a stored sequence (its tokens `key`, its KV `data`) into the slot; the `n` prompt tokens it
        gives, 0 if it failed."""
        try:
            self._ctx.state_seq_set(data, self.seq)
        except LlamaError:
            log.debug("could not restore a stored sequence into slot %d", self.seq, exc_info=True)
            self._ctx.kv_cache_seq_rm(self.seq, 0, -1)
            self.tokens.clear()
            return 0
        self.tokens[:] = key
        return n

    # -- advance ----------------------------------------------------------------
    @property
    def generating(self) -> bool:
        """A sampled token waits to be decoded (the prompt is read)."""
        return self.job is not None and self.next is not None

    def consumed(self, n: int) -> bool:
        """The step decoded the slot's `n` tokens of its batch (its next token, or prompt tokens); whether the
        prompt is now read (so the last of them gave logits to sample from)."""
        if self.next is not None:
            self.tokens.append(self.next)
            self.next = None
        else:
            self.tokens.extend(self.todo[:n])
            del self.todo[:n]
            if not self.todo and self._store is not None and self.job is not None:  # a long prompt: to disk now
                self._store.prefilled(self.tokens, len(self.tokens) - self.job.cached,
                                      lambda: self._ctx.state_seq_get(self.seq))
        self.used = time.perf_counter()
        return not self.todo

    def media_read(self, n_pos: int) -> None:
        """The job's media prompt was evaluated into the sequence: `n_pos` positions no text prompt can match."""
        self.tokens = [-1] * n_pos
        self.used = time.perf_counter()

    def room(self) -> int:
        """Positions the sequence has left."""
        return self._n_ctx_seq - len(self.tokens)

    def limit(self) -> int:
        """The tokens the job may generate: its max_tokens, else what the sequence has room for (with context
        shift, no bound: as llama-server's, the end of generation or a stop ends it)."""
        job = self.job
        assert job is not None
        if job.max_tokens is not None:
            return job.max_tokens
        return _UNBOUNDED if self._shifts() else self._n_ctx_seq - job.n_prompt

    def _shifts(self) -> bool:
        """The job's full sequence shifts rather than ends it (media positions cannot shift: llama-server turns
        context shift off with a projector)."""
        return self._shift and self.job is not None and self.job.media is None

    def full(self) -> bool:
        """A generating text job's next token would fill the sequence: time to shift (llama-server's check before
        each decode, n_tokens + 1 >= n_ctx)."""
        return self.generating and self._shifts() and len(self.tokens) + 1 >= self._n_ctx_seq

    def shift(self) -> tuple[int, int]:
        """llama-server's context shift: drop half of the tokens after the first `keep` (n_discard = (n_past -
        n_keep) / 2) from the cache and move the rest down; (keep, discard). The caller marks the cache edit as
        the engine's own and tells the drafter."""
        job = self.job
        assert job is not None
        # llama-server's n_keep (0) and the BOS: the tokens a shift never drops
        keep, n = min(self._n_ctx_seq - 4, 1 if self._ctx.model.add_bos else 0), len(self.tokens)
        left = n - keep
        discard = max(0, min(left // 2, left - 1))
        self._ctx.kv_cache_seq_discard(self.seq, keep, discard, n)
        del self.tokens[keep:keep + discard]
        job.shifts += 1
        self.clean = keep
        log.info("slot %d: context shift, n_keep = %d, n_left = %d, n_discard = %d", self.seq, keep, left, discard)
        return keep, discard

    def advance(self, idx: int, forced: int | None = None) -> Output:
        """Sample the next token from logits row `idx` and apply the stop rules to it; `forced`: the token taken
        instead of the sampled one (synthetic draft acceptance, speculative.SynthAcceptance), the row still
        sampled so that the samplers' state and draws go on as llama-server's."""
        job = self.job
        assert job is not None
        if job.produced >= self.limit():  # max_tokens=0: the prompt is read, nothing generated
            return Output(reason=StopReason.MAX_TOKENS if job.max_tokens is not None else StopReason.CONTEXT_FULL)
        try:
            token = job.sampler.sample(self._ctx, idx)
            if forced is not None:
                token = forced
            lp = [self._logprobs.read(token, job.n_logprobs, idx)] if job.n_logprobs is not None else None
        except Exception as exc:  # noqa: BLE001 - a job's own sampler (a plugin's Python code too) fails that job only
            return Output(error=exc)
        if not job.first_token:
            job.first_token = time.perf_counter()
        text, reason = self.on_token(token)
        if reason is StopReason.EOS:
            return Output(token, reason=reason)
        if reason is None:
            self.next = token
        return Output(token, CompletionChunk(text, [token], lp), reason)

    def on_token(self, token: int) -> tuple[str, StopReason | None]:
        """The stop rules, for a token just sampled: the text it makes safe to hand on, and the reason the job
        ends with (None: it goes on). A stop string's match is kept on the job (`stop_string`)."""
        job = self.job
        assert job is not None
        model = self._ctx.model
        job.produced += 1  # every token sampled, the end-of-generation one too (llama.cpp's n_decoded)
        if model.token_is_eog(token):
            return "", StopReason.EOS
        assembler = job.text
        text = assembler.feed(model.token_to_piece(token, token in job.render_special))
        if assembler.stopped:
            job.stop_string = assembler.matched
            return text, StopReason.STOP_SEQUENCE
        if job.produced >= self.limit():
            return text, StopReason.MAX_TOKENS if job.max_tokens is not None else StopReason.CONTEXT_FULL
        if len(self.tokens) >= self._n_ctx_seq and not self._shifts():
            return text, StopReason.CONTEXT_FULL
        return text, None

    # -- release ----------------------------------------------------------------
    def release(self) -> Job | None:
        """End the slot's request (its tokens stay for the next prompt to reuse; after a shift only those before
        it: `drop_shifted` cuts the cells after them); the job it ran."""
        job = self.job
        self.job, self.todo, self.next, self.draft = None, [], None, []
        if self.clean is not None:
            del self.tokens[self.clean:]
        return job

    def drop_shifted(self) -> bool:
        """An idle slot that shifted gives back the cells past what it may reuse (the caller marks the edit as the
        engine's own); whether there was such a slot."""
        if self.job is not None or self.clean is None:
            return False
        self._ctx.kv_cache_seq_rm(self.seq, self.clean, -1)
        del self.tokens[self.clean:]
        self.clean = None
        return True

    def give_back(self, store: PrefixStore | None) -> None:
        """An idle slot's cells go back to the cache every sequence shares (kv_unified), its tokens to the host
        store first where there is one (a later prompt may still find them there)."""
        assert self.job is None
        if store is not None:
            self._stash(store, 0)
        self._ctx.kv_cache_seq_rm(self.seq, 0, -1)
        self.forget()

    def forget(self) -> None:
        """What the cache holds for the slot is unknown (a failed decode, an outside edit): reuse nothing of it."""
        self.tokens.clear()
        self.clean = None
