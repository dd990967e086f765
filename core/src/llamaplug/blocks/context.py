"""LlamaContext: the forward pass of one model, and what it left (logits, embeddings).

Logits and embeddings come back as numpy views over llama.cpp's own buffers
(no copy); a view is valid until the next decode on this context. One
context per thread: a context is not safe to share between threads.

The context's other jobs live in modules of their own and are mixed in, so that
seed 004's `ctx.kv_cache_seq_rm(...)`, `ctx.state_get()`, `ctx.set_lora(...)` keep
their names without a forwarding layer: the KV cache (kv_cache.py), its saved state
(state.py), the adapters applied (adapters.py).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..errors import (
    BackendError,
    ContextOverflowError,
    ContextTooLargeError,
    InvalidParameterError,
    check_ptr,
    native_error,
    raise_for_status,
)
from ..params import ContextParams, PoolingType, RopeScalingType, SamplerParams
from ..plugins import pm
from ..raw import ffi, lib
from . import _callback_errors, _native_log
from ._threadpool import ThreadPools
from .adapters import ContextAdapters
from .backend import LlamaBackend
from .batch import LlamaBatch
from .c_params import context_c_params
from .memory import check_fits
from .model import LlamaModel
from .sampling import SamplerChain
from .state import ContextState

log = logging.getLogger("llamaplug.context")


def _interrupted() -> None:
    """A decode was aborted by SIGINT: let Python's pending handler raise KeyboardInterrupt now."""
    lib.llamaplug_take_interrupt()
    _run_pending_signal_handlers()
    _callback_errors.raise_stored()  # the handler may have run inside the log callback already


def _say_size(context: LlamaContext, params: ContextParams) -> None:
    """Warn where the context is not what n_ctx asked for: llama.cpp rounds it up to a multiple of 256 (per sequence),
    and a sequence longer than the training context loads without a word from it at the default log level."""
    model = context.model
    if params.n_ctx and context.n_ctx != params.n_ctx:
        log.warning("n_ctx=%d became %d: llama.cpp rounds the context up to a multiple of 256 per sequence "
                    "(n_seq_max=%d)", params.n_ctx, context.n_ctx, params.n_seq_max)
    scaled = params.rope_scaling_type != RopeScalingType.UNSPECIFIED or params.rope_freq_scale not in (0.0, 1.0)
    if context.n_ctx_seq > model.n_ctx_train > 0 and not scaled:
        log.warning("a sequence holds %d positions here, more than the %d %s was trained on: past those the output "
                    "may degrade (lower n_ctx, or extend the context with rope_scaling_type=YARN)",
                    context.n_ctx_seq, model.n_ctx_train, model.path.name)


def _run_pending_signal_handlers() -> None:
    # Entering a Python function runs pending signal handlers (the default one
    # raises KeyboardInterrupt); if a custom handler did not raise, the caller
    # reports the abort as llama.cpp's return code 2.
    return None


class LlamaContext(ContextState, ContextAdapters):
    """A context on `model`; closed automatically when the model is closed."""

    _what = "context"

    def __init__(self, model: LlamaModel, params: ContextParams | None = None):
        self.params = params = params or ContextParams()
        self._abort_flag = ffi.new("int *")  # read by the C abort callback between graph nodes
        c = context_c_params(params, self._abort_flag)
        if 0 < params.n_outputs_max < params.n_seq_max:  # llama.cpp reserves a row per sequence: an abort
            raise InvalidParameterError(f"n_outputs_max={params.n_outputs_max} is below n_seq_max={params.n_seq_max}"
                                        ": a context reserves a row of logits per sequence (0: n_batch)",
                                        field="n_outputs_max")
        if model.params.vocab_only:  # llama.cpp sizes a context from the layers, which such a model lacks: an abort
            raise InvalidParameterError(f"{model.path.name} was loaded with vocab_only=True: it tokenizes, but a "
                                        "context needs its weights (load it without vocab_only)", field="vocab_only")
        check_fits(params, model)
        with _native_log.capture_errors() as errors:
            ptr = lib.llama_init_from_model(model._ptr, c)
        check_ptr(ptr, ContextTooLargeError,
                  f"could not create a context with n_ctx={model.n_ctx_for(params.n_ctx)}, "
                  f"n_batch={params.n_batch}, n_seq_max={params.n_seq_max} for {model.path.name}", errors,
                  hint=f"lower n_ctx (the model was trained on {model.n_ctx_train} positions) or n_batch")
        self._pools = pools = ThreadPools(c.n_threads, c.n_threads_batch)
        pools.attach(ptr)

        def free(raw: Any) -> None:
            lib.llama_free(raw)
            pools.free()

        self._adopt(ptr, free)
        model._dependents.add(self)
        self.model = model
        self._mem = lib.llama_get_memory(ptr)
        # Rows of logits a batch may ask for: llama.cpp aborts past them (an encoder's context keeps n_batch).
        reserved = params.n_outputs_max and not lib.llama_model_has_encoder(model._ptr)
        self._n_outputs_max = params.n_outputs_max if reserved else self.n_batch
        # Every token of a batch has an output: embeddings, or a model without a KV cache (decode is an encode).
        self._all_outputs = params.embeddings or self._mem == ffi.NULL
        self._recurrent = bool(lib.llama_model_is_recurrent(model._ptr) or lib.llama_model_is_hybrid(model._ptr))
        self.n_vocab = model.n_vocab
        self._loras = {}
        self.n_past = 0
        self.epoch = 0  # see KvCache.epoch
        self._row_view: tuple[int, np.ndarray | None] = (0, None)
        self._one = LlamaBatch(1, 1)
        self._one.add(0, 0, (0,), True)
        # Which tokens of the last batch produced outputs, to check get_logits_ith's index.
        self._outputs = np.zeros(0, dtype=np.int8)
        self._rpc_lost = LlamaBackend.init().rpc_watch()  # None without RPC servers: nothing to check
        self.backend_lost: str | None = None  # the RPC server whose connection a decode lost (see _check_rpc)
        pm.hook.llamaplug_context_created(context=self)
        _say_size(self, params)

    def note_decoded(self, outputs: np.ndarray, n_past: int | None = None) -> None:
        """Record a decode made outside this object (a plugin's helper): which tokens of its last batch have
        outputs (int8, as LlamaBatch.logits) and, for sequence 0, the next position."""
        self._outputs = outputs
        if n_past is not None:
            self.n_past = n_past

    @property
    def recurrent(self) -> bool:
        """A recurrent or hybrid model's context: a sequence cannot be cut back to a position."""
        return self._recurrent

    # -- sizes ---------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return int(lib.llama_n_ctx(self._ptr))

    @property
    def n_ctx_seq(self) -> int:
        """The positions one sequence can hold (n_ctx / n_seq_max unless kv_unified)."""
        return int(lib.llama_n_ctx_seq(self._ptr))

    def abort(self) -> None:
        """Make the running (or next) decode stop between graph nodes: it raises DecodeError with code 2.

        Callable from any thread; `clear_abort()` lets decoding go on. What the aborted decode
        had already written to the KV cache stays there (llama.cpp's rule): roll it back with
        kv_cache_seq_rm.
        """
        self._abort_flag[0] = 1

    def clear_abort(self) -> None:
        self._abort_flag[0] = 0

    @property
    def n_batch(self) -> int:
        return int(lib.llama_n_batch(self._ptr))

    @property
    def n_outputs_max(self) -> int:
        """The most rows of logits (outputs) one batch may ask for (ContextParams.n_outputs_max, 0: n_batch)."""
        return self._n_outputs_max

    @property
    def n_ubatch(self) -> int:
        return int(lib.llama_n_ubatch(self._ptr))

    @property
    def pooling_type(self) -> PoolingType:
        """How llama.cpp pools this context's embeddings (the model's own where ContextParams left it open)."""
        return PoolingType(int(lib.llama_pooling_type(self._ptr)))

    def set_n_threads(self, n_threads: int, n_threads_batch: int | None = None) -> None:
        # The same bounds as ContextParams' fields.
        checked = self.params.replace(n_threads=n_threads, n_threads_batch=n_threads_batch)
        n_threads, n_threads_batch = checked.n_threads, checked.n_threads_batch
        self._pools.resize(self._ptr, n_threads, n_threads_batch or n_threads)
        lib.llama_set_n_threads(self._ptr, n_threads, n_threads_batch or n_threads)

    # -- forward pass --------------------------------------------------------
    def _check_batch(self, batch: LlamaBatch, all_outputs: bool = False) -> None:
        n = batch.n_tokens
        if n == 0:
            raise InvalidParameterError("cannot decode an empty batch", field="batch")
        if not 0 < n <= batch.capacity:  # n_tokens and n_seq_id are public: llama.cpp segfaults on bad ones
            raise InvalidParameterError(f"batch.n_tokens={n} is outside 1..{batch.capacity} (its capacity)",
                                        field="n_tokens")
        if n > self.n_batch:
            raise InvalidParameterError(f"batch of {n} tokens exceeds n_batch={self.n_batch}", field="batch")
        if n > self._n_outputs_max:
            n_out = n if all_outputs or self._all_outputs else int(np.count_nonzero(batch.logits[:n]))
            if n_out > self._n_outputs_max:
                raise InvalidParameterError(
                    f"the batch asks for {n_out} rows of logits, the context reserves {self._n_outputs_max} "
                    "(n_outputs_max): ask for logits on fewer tokens or raise ContextParams.n_outputs_max",
                    field="batch.logits")
        self.model.check_tokens(batch.token[:n])
        counts = batch.n_seq_id[:n]
        if counts.min() < 1 or counts.max() > batch.n_seq_max:
            bad = int(np.flatnonzero((counts < 1) | (counts > batch.n_seq_max))[0])
            raise InvalidParameterError(f"token {bad} of the batch has n_seq_id={int(counts[bad])}, "
                                        f"not in 1..{batch.n_seq_max}", field="n_seq_id")
        if counts.max() > 1 and not self.params.kv_unified and not self._recurrent:
            # llama.cpp's per-sequence caches cannot split such a batch and report "no KV slot" (code 1).
            bad = int(np.flatnonzero(counts > 1)[0])
            raise InvalidParameterError(
                f"token {bad} of the batch is in {int(counts[bad])} sequences: a token shared by sequences needs "
                "one KV cache for all of them, ContextParams(kv_unified=True)", field="n_seq_id")
        seqs = batch.seq_ids[:n]
        used = np.arange(batch.n_seq_max) < batch.n_seq_id[:n, None]
        if used.any() and (seqs[used].min() < 0 or seqs[used].max() >= self.n_seq_max):
            bad = int(seqs[used][(seqs[used] < 0) | (seqs[used] >= self.n_seq_max)][0])
            raise InvalidParameterError(f"seq_id {bad} is outside 0..{self.n_seq_max - 1} (n_seq_max)",
                                        field="seq_id")
        low = int(batch.pos[:n].min())
        if low < 0:  # llama.cpp takes -1 and stores a cell its own pos_max cannot see; refuses -2 and below
            raise InvalidParameterError(f"position {low} is negative", field="pos")
        top = int(batch.pos[:n].max())
        if top >= self.n_ctx:
            raise ContextOverflowError(f"position {top} is outside the context window (n_ctx={self.n_ctx})")

    def decode(self, batch: LlamaBatch | Any) -> None:
        """Run a batch; or, given token ids, feed them to sequence 0 at n_past in n_batch chunks."""
        if not isinstance(batch, LlamaBatch):
            self.eval(batch, self.n_past)
            return
        self._check_batch(batch)
        with _native_log.capture_errors() as errors:
            rc = lib.llama_decode(self._ptr, batch.c_batch())
        if self._rpc_lost is not None:
            self._check_rpc()
        if rc == 2:
            _interrupted()
        raise_for_status("llama_decode", rc, n_tokens=batch.n_tokens, native=errors)
        self._outputs = batch.logits[: batch.n_tokens].copy()
        self.epoch += 1
        self.n_past = max(self.n_past, int(batch.pos[: batch.n_tokens].max()) + 1)

    def _check_rpc(self) -> None:
        """After a decode on a process with RPC servers: BackendError if a connection broke (its outputs are
        zeros, and every later decode on its devices fails); the context stays unusable (`backend_lost`)."""
        lib.llama_synchronize(self._ptr)  # the outputs' reads complete (or fail) first
        assert self._rpc_lost is not None
        lost = self.backend_lost or self._rpc_lost()
        if lost:
            self.backend_lost = lost
            raise BackendError(f"the connection to the RPC server {lost} was lost during llama_decode: this model "
                               "cannot decode until it is loaded again, once the server is back")

    def warm_up(self) -> None:
        """One decode of [BOS, EOS] at position 0, then an empty cache, as llama.cpp's tools run before they
        report ready: the first decode's own costs (the weights paged in from the mapped file, first-use
        allocations in the backends) are paid here, not by the first request. The cache is emptied first too
        (llama.cpp refuses position 0 after a sequence's tokens). A model without a decoder is left as it is."""
        model = self.model
        if not model.has_decoder or model.has_encoder:
            return
        tokens = [t for t in (model.bos, model.eos) if t is not None and t >= 0] or [0]
        batch = LlamaBatch(len(tokens), 1)
        batch.add_sequence(tokens, 0, False)
        self.clear_cache()
        try:
            self.decode(batch)
        finally:
            self.clear_cache()
            lib.llama_synchronize(self._ptr)
            lib.llama_perf_context_reset(self._ptr)

    def encode(self, batch: LlamaBatch) -> None:
        self._check_batch(batch, all_outputs=True)
        rc = lib.llama_encode(self._ptr, batch.c_batch())
        if rc == 2:
            _interrupted()
        raise_for_status("llama_encode", rc, n_tokens=batch.n_tokens)

    def eval(self, tokens: Any, n_past: int) -> None:
        """Feed `tokens` to sequence 0 at positions n_past, n_past+1, ...; logits for the last one."""
        arr = self.model.check_tokens(tokens)
        if arr.size == 0:
            raise InvalidParameterError("no tokens to evaluate", field="tokens")
        if n_past < 0:
            raise InvalidParameterError(f"n_past must be >= 0, got {n_past}", field="n_past")
        if n_past + arr.size > self.n_ctx:
            raise ContextOverflowError(
                f"{arr.size} tokens at position {n_past} do not fit in the context window (n_ctx={self.n_ctx})"
            )
        step = self.n_batch
        batch = LlamaBatch(min(step, arr.size), 1)
        for start in range(0, arr.size, step):
            batch.clear()
            batch.add_sequence(arr[start:start + step], 0, False, n_past + start)
            self.decode(batch)
        self.n_past = n_past + arr.size

    def decode_single(self, token: int) -> None:
        """Feed one token to sequence 0 at n_past: the generation loop's step (no allocation)."""
        if not 0 <= token < self.n_vocab:
            self.model.check_token(token)
        if self.n_past >= self.n_ctx:
            raise ContextOverflowError(f"the context window is full (n_ctx={self.n_ctx})")
        one = self._one
        one.token[0] = token
        one.pos[0] = self.n_past
        rc = lib.llama_decode(self._ptr, one.c_batch())
        if self._rpc_lost is not None:
            self._check_rpc()
        if rc:
            if rc == 2:
                _interrupted()
            raise_for_status("llama_decode", rc, token=token, pos=self.n_past)
        self._outputs = one.logits
        self.epoch += 1
        self.n_past += 1

    # -- outputs -------------------------------------------------------------
    def check_output_index(self, i: int) -> int:
        """`i` (negative counts from the end) if token i of the last batch produced outputs."""
        n = self._outputs.size
        j = i + n if i < 0 else i
        if not 0 <= j < n or not self._outputs[j]:
            where = f" with outputs at {np.flatnonzero(self._outputs).tolist()[:8]}" if n else " (nothing decoded yet)"
            raise InvalidParameterError(
                f"no logits for batch index {i}: the last batch had {n} tokens{where}",
                field="i",
            )
        return i

    def get_logits(self) -> np.ndarray:
        """Logits of every output of the last batch, shape (n_outputs, n_vocab), a view."""
        n_out = int(np.count_nonzero(self._outputs))
        if n_out == 0:
            raise InvalidParameterError("no logits: nothing with outputs was decoded yet", field="logits")
        ptr = lib.llama_get_logits(self._ptr)
        return np.frombuffer(ffi.buffer(ptr, 4 * n_out * self.n_vocab), dtype=np.float32).reshape(n_out, -1)

    def get_logits_ith(self, i: int) -> np.ndarray:
        """Logits for token `i` of the last batch (-1: the last), a view of n_vocab floats."""
        self._ptr  # noqa: B018 - a closed context says so before a bad index does
        return self._logits_row(self.check_output_index(i))

    def _logits_row(self, i: int) -> np.ndarray:
        """get_logits_ith for an index already checked."""
        ptr = lib.llama_get_logits_ith(self._ptr, i)
        if ptr == ffi.NULL:  # tested here, not in check_ptr: this is the generation loop's path
            raise native_error(InvalidParameterError, f"llama.cpp has no logits for batch index {i}", field="i")
        # Generation asks for the same row of the same buffer every token: keep its view.
        address = int(ffi.cast("uintptr_t", ptr))
        cached, view = self._row_view
        if view is None or cached != address:
            view = np.frombuffer(ffi.buffer(ptr, 4 * self.n_vocab), dtype=np.float32)
            self._row_view = (address, view)
        return view

    def get_embeddings_ith(self, i: int) -> np.ndarray:
        if not self.params.embeddings:
            raise InvalidParameterError("embeddings are off: create the context with embeddings=True",
                                        field="embeddings")
        ptr = check_ptr(lib.llama_get_embeddings_ith(self._ptr, self.check_output_index(i)),
                        InvalidParameterError, f"no embeddings for batch index {i}", field="i")
        return np.frombuffer(ffi.buffer(ptr, 4 * self.model.n_embd), dtype=np.float32)

    def get_embeddings_seq(self, seq_id: int) -> np.ndarray:
        self._check_seq(seq_id)
        ptr = check_ptr(lib.llama_get_embeddings_seq(self._ptr, seq_id), InvalidParameterError,
                        f"no pooled embeddings for seq_id {seq_id} (pooling_type NONE?)", field="seq_id")
        # Rank pooling leaves n_cls_out scores per sequence, not a vector: reading n_embd would overrun it.
        n = self.model.n_cls_out if self.pooling_type == PoolingType.RANK else self.model.n_embd_out
        return np.frombuffer(ffi.buffer(ptr, 4 * n), dtype=np.float32)

    # -- perf ----------------------------------------------------------------
    def perf(self) -> dict[str, float]:
        data = lib.llama_perf_context(self._ptr)
        return {name: getattr(data, name) for name in
                ("t_start_ms", "t_load_ms", "t_p_eval_ms", "t_eval_ms", "n_p_eval", "n_eval", "n_reused")}

    def perf_reset(self) -> None:
        lib.llama_perf_context_reset(self._ptr)

    # -- generation (seed 004) -----------------------------------------------
    def generate(self, prompt_tokens: Any, max_tokens: int) -> str:
        """Text generated after `prompt_tokens` with the default sampling settings."""
        return self.generate_with_params(prompt_tokens, max_tokens, SamplerParams())

    def generate_with_params(self, prompt_tokens: Any, max_tokens: int, sampler_params: SamplerParams) -> str:
        if max_tokens < 0:
            raise InvalidParameterError(f"max_tokens must be >= 0, got {max_tokens}", field="max_tokens")
        tokens = self.model.check_tokens(prompt_tokens)
        if tokens.size == 0:
            raise InvalidParameterError("the prompt has no tokens", field="prompt_tokens")
        self.clear_cache()
        self.eval(tokens, 0)
        out: list[int] = []
        with SamplerChain.from_params(sampler_params) as sampler:
            for _ in range(max_tokens):
                token = sampler.sample(self, -1)
                if self.model.token_is_eog(token):
                    break
                out.append(token)
                if self.n_past >= self.n_ctx:
                    break
                self.decode_single(token)
        return self.model.detokenize(out)

    def __repr__(self) -> str:
        return "<LlamaContext closed>" if self.closed else f"<LlamaContext n_ctx={self.n_ctx} n_past={self.n_past}>"
