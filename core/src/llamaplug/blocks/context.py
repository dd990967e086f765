"""LlamaContext: the KV cache and the forward pass of one model.

Logits and embeddings come back as numpy views over llama.cpp's own buffers
(no copy); a view is valid until the next decode on this context. One
context per thread: a context is not safe to share between threads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    ClosedError,
    ContextOverflowError,
    ContextTooLargeError,
    InvalidParameterError,
    StateError,
    native_error,
    raise_for_status,
)
from ..params import ContextParams, SamplerParams
from ..plugins import pm
from ..raw import ffi, lib
from . import _callback_errors, _native_log
from ._handle import NativeHandle
from ._threadpool import ThreadPools
from .adapters import AdapterState, ControlVector, LoraAdapter, check_scale
from .batch import LlamaBatch
from .c_params import context_c_params
from .memory import check_fits
from .model import LlamaModel
from .sampling import SamplerChain
from .state import check_state_file, check_state_head


def _interrupted() -> None:
    """A decode was aborted by SIGINT: let Python's pending handler raise KeyboardInterrupt now."""
    lib.llamaplug_take_interrupt()
    _run_pending_signal_handlers()
    _callback_errors.raise_stored()  # the handler may have run inside the log callback already


def _run_pending_signal_handlers() -> None:
    # Entering a Python function runs pending signal handlers (the default one
    # raises KeyboardInterrupt); if a custom handler did not raise, the caller
    # reports the abort as llama.cpp's return code 2.
    return None


class LlamaContext(NativeHandle):
    """A context on `model`; closed automatically when the model is closed."""

    _what = "context"

    def __init__(self, model: LlamaModel, params: ContextParams | None = None):
        self.params = params = params or ContextParams()
        self._abort_flag = ffi.new("int *")  # read by the C abort callback between graph nodes
        c = context_c_params(params, self._abort_flag)
        check_fits(params, model)
        with _native_log.capture_errors() as errors:
            ptr = lib.llama_init_from_model(model._ptr, c)
        if ptr == ffi.NULL:
            raise native_error(
                ContextTooLargeError,
                f"could not create a context with n_ctx={params.n_ctx or model.n_ctx_train}, "
                f"n_batch={params.n_batch}, n_seq_max={params.n_seq_max} for {model.path.name}", errors,
                hint="lower n_ctx or n_batch")
        self._pools = pools = ThreadPools(c.n_threads, c.n_threads_batch)
        pools.attach(ptr)

        def free(raw: Any) -> None:
            lib.llama_free(raw)
            pools.free()

        self._adopt(ptr, free)
        model._dependents.add(self)
        self.model = model
        self._mem = lib.llama_get_memory(ptr)
        self._recurrent = bool(lib.llama_model_is_recurrent(model._ptr) or lib.llama_model_is_hybrid(model._ptr))
        self.n_vocab = model.n_vocab
        self._adapters = AdapterState()
        self._cvec: np.ndarray | None = None
        self.n_past = 0
        # Bumped by everything that changes the KV cache or how it is computed (decodes, cache
        # edits, adapters, states): the engine's prefix cache trusts its slots only while it has not moved.
        self.epoch = 0
        self._row_view: tuple[int, np.ndarray | None] = (0, None)
        self._one = LlamaBatch(1, 1)
        self._one.add(0, 0, (0,), True)
        # Which tokens of the last batch produced outputs, to check get_logits_ith's index.
        self._outputs = np.zeros(0, dtype=np.int8)
        pm.hook.llamaplug_context_created(context=self)

    def raw_handle(self) -> Any:
        """The `llama_context *` for the raw layer (valid while this context is open)."""
        return self._ptr

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
    def n_ubatch(self) -> int:
        return int(lib.llama_n_ubatch(self._ptr))

    @property
    def n_seq_max(self) -> int:
        return int(lib.llama_n_seq_max(self._ptr))

    def set_n_threads(self, n_threads: int, n_threads_batch: int | None = None) -> None:
        # The same bounds as ContextParams' fields.
        checked = self.params.replace(n_threads=n_threads, n_threads_batch=n_threads_batch)
        n_threads, n_threads_batch = checked.n_threads, checked.n_threads_batch
        self._pools.resize(self._ptr, n_threads, n_threads_batch or n_threads)
        lib.llama_set_n_threads(self._ptr, n_threads, n_threads_batch or n_threads)

    # -- forward pass --------------------------------------------------------
    def _check_batch(self, batch: LlamaBatch) -> None:
        n = batch.n_tokens
        if n == 0:
            raise InvalidParameterError("cannot decode an empty batch", field="batch")
        if not 0 < n <= batch.capacity:  # n_tokens and n_seq_id are public: llama.cpp segfaults on bad ones
            raise InvalidParameterError(f"batch.n_tokens={n} is outside 1..{batch.capacity} (its capacity)",
                                        field="n_tokens")
        if n > self.n_batch:
            raise InvalidParameterError(f"batch of {n} tokens exceeds n_batch={self.n_batch}", field="batch")
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
        if rc == 2:
            _interrupted()
        raise_for_status("llama_decode", rc, n_tokens=batch.n_tokens, native=errors)
        self._outputs = batch.logits[: batch.n_tokens].copy()
        self.epoch += 1
        self.n_past = max(self.n_past, int(batch.pos[: batch.n_tokens].max()) + 1)

    def encode(self, batch: LlamaBatch) -> None:
        self._check_batch(batch)
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
        if ptr == ffi.NULL:
            raise InvalidParameterError(f"llama.cpp has no logits for batch index {i}", field="i")
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
        ptr = lib.llama_get_embeddings_ith(self._ptr, self.check_output_index(i))
        if ptr == ffi.NULL:
            raise InvalidParameterError(f"no embeddings for batch index {i}", field="i")
        return np.frombuffer(ffi.buffer(ptr, 4 * self.model.n_embd), dtype=np.float32)

    def get_embeddings_seq(self, seq_id: int) -> np.ndarray:
        self._check_seq(seq_id)
        ptr = lib.llama_get_embeddings_seq(self._ptr, seq_id)
        if ptr == ffi.NULL:
            raise InvalidParameterError(f"no pooled embeddings for seq_id {seq_id} (pooling_type NONE?)",
                                        field="seq_id")
        # Rank pooling leaves n_cls_out scores per sequence, not a vector: reading n_embd would overrun it.
        rank = int(lib.llama_pooling_type(self._ptr)) == lib.LLAMA_POOLING_TYPE_RANK
        n = lib.llama_model_n_cls_out(self.model._ptr) if rank else lib.llama_model_n_embd_out(self.model._ptr)
        return np.frombuffer(ffi.buffer(ptr, 4 * int(n)), dtype=np.float32)

    # -- KV cache ------------------------------------------------------------
    def _check_seq(self, seq_id: int, allow_all: bool = False) -> None:
        if allow_all and seq_id == -1:
            return
        if not 0 <= seq_id < self.n_seq_max:
            raise InvalidParameterError(
                f"seq_id {seq_id} is outside 0..{self.n_seq_max - 1} (n_seq_max={self.n_seq_max})"
                + (" or -1 for all" if allow_all else ""), field="seq_id")

    @property
    def _memory(self) -> Any:
        self._ptr  # noqa: B018 - raises ClosedError once closed
        return self._mem

    def clear_cache(self) -> None:
        """Empty the KV cache of every sequence."""
        lib.llama_memory_clear(self._memory, True)
        self.epoch += 1
        self.n_past = 0
        self._outputs = np.zeros(0, dtype=np.int8)

    kv_cache_clear = clear_cache

    def kv_cache_seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        self.epoch += 1
        self._check_seq(seq_id, allow_all=True)
        ok = bool(lib.llama_memory_seq_rm(self._memory, seq_id, p0, p1))
        if ok and seq_id in (0, -1):  # sequence 0 is the one n_past tracks
            self.n_past = int(lib.llama_memory_seq_pos_max(self._memory, 0)) + 1
        return ok

    def kv_cache_seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        self.epoch += 1
        self._check_seq(seq_id_src)
        self._check_seq(seq_id_dst)
        lib.llama_memory_seq_cp(self._memory, seq_id_src, seq_id_dst, p0, p1)

    def kv_cache_seq_keep(self, seq_id: int) -> None:
        self.epoch += 1
        self._check_seq(seq_id)
        lib.llama_memory_seq_keep(self._memory, seq_id)

    def kv_cache_seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Add `delta` to the positions in [p0, p1) of `seq_id` (seed 004's kv_cache_seq_shift).

        The sliding window: drop [keep, keep + n) with kv_cache_seq_rm, shift what follows
        by -n; n_past then follows sequence 0's new end, so decoding goes on after it.
        """
        self._check_seq(seq_id)
        if not lib.llama_memory_can_shift(self._memory):
            raise InvalidParameterError("this model's memory cannot shift positions", field="delta")
        lib.llama_memory_seq_add(self._memory, seq_id, p0, p1, delta)
        self.epoch += 1
        if seq_id == 0:
            self.n_past = int(lib.llama_memory_seq_pos_max(self._memory, 0)) + 1

    kv_cache_seq_shift = kv_cache_seq_add

    def kv_cache_seq_pos_min(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        return int(lib.llama_memory_seq_pos_min(self._memory, seq_id))

    def kv_cache_seq_pos_max(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        return int(lib.llama_memory_seq_pos_max(self._memory, seq_id))

    # -- adapters ------------------------------------------------------------
    def set_lora(self, adapter: LoraAdapter, scale: float = 1.0) -> None:
        """Apply `adapter` at `scale` (set again to change the scale; several adapters add up)."""
        self.epoch += 1
        if adapter.closed:
            raise ClosedError("this LoRA adapter is closed")
        if adapter.model is not self.model:
            raise InvalidParameterError(f"{adapter.path.name} was loaded for {adapter.model.path.name}, not for "
                                        f"this context's {self.model.path.name}", field="adapter")
        self._adapters.loras[adapter] = check_scale(scale)
        self._adapters.apply_loras(self._ptr)

    def remove_lora(self, adapter: LoraAdapter) -> None:
        self.epoch += 1
        if self._adapters.loras.pop(adapter, None) is None:
            raise InvalidParameterError("that LoRA adapter is not applied to this context", field="adapter")
        self._adapters.apply_loras(self._ptr)

    def clear_loras(self) -> None:
        self.epoch += 1
        self._adapters.loras.clear()
        self._adapters.apply_loras(self._ptr)

    @property
    def loras(self) -> dict[LoraAdapter, float]:
        return dict(self._adapters.loras)

    def apply_control_vector(self, vector: ControlVector | Any | None, layer_start: int = 1,
                             layer_end: int | None = None) -> None:
        """Add `vector` (a ControlVector, or an (n_layers, n_embd) array from layer 1) to layers
        layer_start..layer_end (inclusive; default: all it has); None removes it."""
        self.epoch += 1
        if vector is None:
            lib.llama_set_adapter_cvec(self._ptr, ffi.NULL, 0, self.model.n_embd, 0, 0)
            self._cvec = None
            return
        data = (vector if isinstance(vector, ControlVector) else ControlVector(vector)).data
        n_layers, n_embd = data.shape
        if n_embd != self.model.n_embd:
            raise InvalidParameterError(f"the control vector has {n_embd} values a layer, {self.model.path.name} "
                                        f"has n_embd={self.model.n_embd}", field="vector")
        end = n_layers if layer_end is None else layer_end
        if not 1 <= layer_start <= end <= min(n_layers, self.model.n_layer):
            top = min(n_layers, self.model.n_layer)
            raise InvalidParameterError(f"layers {layer_start}..{end} are outside 1..{top} (the vector's and the "
                                        "model's layers)", field="layer_start")
        with _native_log.capture_errors() as errors:
            rc = lib.llama_set_adapter_cvec(self._ptr, ffi.from_buffer("float[]", data), data.size, n_embd,
                                            layer_start, end)
        if rc != 0:
            raise native_error(InvalidParameterError, "llama.cpp refused the control vector", errors,
                               field="vector")
        self._cvec = data  # llama.cpp copies it; kept for inspection

    # -- state ---------------------------------------------------------------
    def state_size(self) -> int:
        return int(lib.llama_state_get_size(self._ptr))

    def state_get(self) -> bytes:
        """The context state (the KV cache) as bytes."""
        size = self.state_size()
        buf = ffi.new("uint8_t[]", size)
        written = lib.llama_state_get_data(self._ptr, buf, size)
        if written == 0:
            raise StateError("llama.cpp could not serialise the context state")
        return ffi.unpack(ffi.cast("char *", buf), written)

    def state_set(self, data: bytes, n_past: int | None = None) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)) or not len(data):
            raise StateError("state must be non-empty bytes from state_get()")
        check_state_head(bytes(memoryview(data)[:4]), len(data), "the state data")
        with _native_log.capture_errors() as errors:
            read = lib.llama_state_set_data(self._ptr, ffi.from_buffer("uint8_t[]", data), len(data))
        if read == 0:
            self._resync()  # llama.cpp may have cleared or half-written the cache before it gave up
            raise native_error(StateError, f"llama.cpp rejected the state ({len(data)} bytes)", errors)
        self.n_past = self.kv_cache_seq_pos_max(0) + 1 if n_past is None else n_past
        self._outputs = np.zeros(0, dtype=np.int8)  # llama.cpp does not restore logits: decode first
        self.epoch += 1

    def state_seq_get(self, seq_id: int) -> bytes:
        """One sequence's KV cells as bytes (for state_seq_set on a context of the same model and shape)."""
        self._check_seq(seq_id)
        size = int(lib.llama_state_seq_get_size(self._ptr, seq_id))
        buf = ffi.new("uint8_t[]", size)
        written = lib.llama_state_seq_get_data(self._ptr, buf, size, seq_id)
        if written == 0:
            raise StateError(f"llama.cpp could not serialise sequence {seq_id}")
        return ffi.unpack(ffi.cast("char *", buf), written)

    def state_seq_set(self, data: bytes, seq_id: int) -> None:
        """Replace sequence `seq_id`'s cells by those of state_seq_get's bytes (logits: decode first)."""
        self._check_seq(seq_id)
        if not isinstance(data, (bytes, bytearray, memoryview)) or not len(data):
            raise StateError("sequence state must be non-empty bytes from state_seq_get()")
        self.epoch += 1
        with _native_log.capture_errors() as errors:
            read = lib.llama_state_seq_set_data(self._ptr, ffi.from_buffer("uint8_t[]", data), len(data), seq_id)
        if seq_id == 0:
            self.n_past = self.kv_cache_seq_pos_max(0) + 1
        if read == 0:
            raise native_error(StateError, f"llama.cpp rejected the state of sequence {seq_id} ({len(data)} bytes)",
                               errors)

    def _resync(self) -> None:
        """n_past from what the cache holds now; no logits until the next decode."""
        self.n_past = self.kv_cache_seq_pos_max(0) + 1
        self._outputs = np.zeros(0, dtype=np.int8)
        self.epoch += 1

    def state_save_file(self, path: str | os.PathLike[str], tokens: Any = ()) -> Path:
        target = Path(path)
        arr = self.model.check_tokens(tokens)
        c_tokens = ffi.from_buffer("llama_token[]", arr) if arr.size else ffi.NULL
        if not lib.llama_state_save_file(self._ptr, str(target).encode(), c_tokens, arr.size):
            raise StateError(f"could not save the context state to {target}")
        return target

    def state_load_file(self, path: str | os.PathLike[str]) -> list[int]:
        """Restore a state saved by state_save_file; returns the tokens saved with it."""
        source = Path(path)
        if not source.is_file():
            raise StateError(f"state file not found: {source}")
        check_state_file(source)
        capacity = self.n_ctx
        tokens = ffi.new("llama_token[]", capacity)
        n = ffi.new("size_t *")
        with _native_log.capture_errors() as errors:
            ok = lib.llama_state_load_file(self._ptr, str(source).encode(), tokens, capacity, n)
        if not ok:
            self._resync()
            raise native_error(StateError, f"could not load state from {source}", errors)
        self.n_past = int(n[0])
        self.epoch += 1
        return ffi.unpack(tokens, int(n[0]))

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
