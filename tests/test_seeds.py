"""The seeds' examples, translated to Python, run as written (docs/seeds.md has the translation rules).

Translation: Rust's accessor calls `llama.model()` / `llama.context()` / `ctx.n_ctx()` are
properties; `Type::new(a)` is `Type(a)`; `?` is a raised LlamaError; `.await` is gone (build() is
synchronous). Model paths are the real SmolLM2 file; thread counts of 8 become the 2 cores
this machine has where the example then generates (an 8-thread pool on 2 cores measures
the scheduler, not llamaplug). Everything else is the seed's own code and values.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from llamaplug_testing import THREADS, run_isolated

import llamaplug as lp

# -- seed 001: the data flow of one completion -------------------------------------------


def test_seed001_llama_load_and_create_completion(smollm2_path):
    llama = lp.Llama.load(lp.LlamaParams(smollm2_path).with_n_ctx(2048).with_n_gpu_layers(99))
    resp = llama.create_completion("Hello", 32)
    assert isinstance(resp.text, str) and 0 < len(resp.tokens) <= 32
    assert resp.stop_reason in lp.StopReason
    # every token sampled is counted, the end-of-generation one too (which the text and `tokens` leave out)
    assert resp.timings.predicted_tokens == len(resp.tokens) + (resp.stop_reason is lp.StopReason.EOS)
    llama.close()


def test_seed001_backend_guards():
    code = """
import llamaplug as lp
from llamaplug import LlamaBackend, NumaStrategy
_backend = LlamaBackend.init()
_backend = LlamaBackend.init_numa(NumaStrategy.DISTRIBUTE)
assert _backend is LlamaBackend.init() and _backend.numa == NumaStrategy.DISTRIBUTE
print("ok")
"""
    done = run_isolated(code)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def seed001_manual_loop(llama: lp.Llama, prompt: str, accept_too: bool, max_new: int = 24) -> list[int]:
    """Steps 3 to 7 of seed 001, as written there."""
    tokens = llama.model.tokenize(prompt, True, True)

    batch = lp.LlamaBatch(len(tokens), 1)
    batch.add_sequence(tokens, 0, False)
    batch.prepare()
    llama.context.clear_cache()
    llama.context.decode(batch)

    sampler = (lp.SamplerChain(seed=1234)
               .temp(0.8)
               .top_p(0.95, 1)
               .min_p(0.05, 1)
               .penalties(64, 1.1, 0.0, 0.0)
               .build())
    n_past = len(tokens)
    generated: list[int] = []
    for _ in range(max_new):
        next_token = sampler.sample(llama.context.raw_handle(), -1)
        if accept_too:
            sampler.accept(next_token)
        if llama.model.token_is_eog(next_token):
            break
        generated.append(next_token)
        single = lp.LlamaBatch.one(next_token, n_past, 0, True)
        llama.context.decode(single)
        n_past += 1
    assert "dist (appended)" in sampler._describe()  # the seed's chain selects nothing itself
    return generated


def test_seed001_manual_steps_sample_then_accept_counts_a_token_once(llama):
    with_accept = seed001_manual_loop(llama, "The capital of France is", accept_too=True)
    without = seed001_manual_loop(llama, "The capital of France is", accept_too=False)
    assert with_accept == without and len(with_accept) > 0
    text = llama.model.detokenize(with_accept, False)
    assert isinstance(text, str) and text


def test_accept_of_another_token_is_counted():
    chain = lp.SamplerChain(n_vocab=10).penalties(64, 1.1, 0.0, 0.0)
    chain._just_sampled = 3
    chain.accept(3)  # the token sample() returned: already counted
    assert chain._just_sampled is None
    chain.accept(3)  # a second accept is the user's own: counted
    chain.accept(4)


def test_seed001_completion_struct_fields(llama):
    out = llama.create_completion("The capital of France is", max_tokens=8, logprobs=2)
    assert {"text", "tokens", "logprobs", "timings", "stop_reason"} <= set(vars(out))
    assert len(out.logprobs) == len(out.tokens)


# -- seed 002: backends and offload ---------------------------------------------------------


def test_seed002_capability_probes():
    backend = lp.LlamaBackend.init()
    answers = [backend.supports_gpu_offload(), backend.supports_mmap(), backend.supports_mlock(),
               backend.supports_rpc()]
    assert all(isinstance(a, bool) for a in answers)
    assert backend.supports_rpc() == any(s.name == "rpc" and s.loaded for s in backend.backends())


def test_seed002_offload_threads_and_flash_attention(smollm2_path):
    params = lp.LlamaParams(smollm2_path).with_n_ctx(4096).with_n_gpu_layers(99).with_flash_attn(True)
    assert params.flash_attn_type == lp.FlashAttnType.ENABLED and params.n_gpu_layers == 99
    assert lp.LlamaParams(smollm2_path).with_n_threads(8).n_threads == 8
    assert lp.LlamaParams(smollm2_path).with_n_threads_batch(8).n_threads_batch == 8
    llama = lp.Llama.load(params.with_n_threads(THREADS))
    assert llama.context.n_ctx == 4096 and llama.context.params.flash_attn_type == lp.FlashAttnType.ENABLED
    assert llama.create_completion("The capital of France is", 4).tokens
    llama.close()


# -- seed 003: the raw layer (each example in its own interpreter: nothing in raw is safe) -----

SEED003_BASIC = """
import llamaplug.raw as llama_cpp
import ctypes

# Initialize backend
llama_cpp.llama_backend_init()
print("Backend initialized")

try:
    # Get default parameters
    model_params = llama_cpp.llama_model_default_params()
    context_params = llama_cpp.llama_context_default_params()

    # Load model
    model_path = MODEL
    model = llama_cpp.llama_model_load_from_file(model_path, model_params)

    if not model:
        raise Exception("Failed to load model")
    print("Model loaded successfully")

    # Create context
    context = llama_cpp.llama_new_context_with_model(model, context_params)

    if not context:
        raise Exception("Failed to create context")
    print("Context created successfully")

    # Get model information
    n_ctx = llama_cpp.llama_n_ctx(context)
    n_embd = llama_cpp.llama_n_embd(model)

    print(f"Context size: {n_ctx}")
    print(f"Embedding dimensions: {n_embd}")

finally:
    # Cleanup
    if 'context' in locals():
        llama_cpp.llama_free(context)
    if 'model' in locals():
        llama_cpp.llama_model_free(model)

    llama_cpp.llama_backend_free()
    print("Cleanup completed")
"""

SEED003_CAPABILITIES = """
import llamaplug.raw as llama_cpp

# Check system capabilities
capabilities = {
    "mmap_support": llama_cpp.llama_supports_mmap(),
    "mlock_support": llama_cpp.llama_supports_mlock(),
    "gpu_offload": llama_cpp.llama_supports_gpu_offload(),
    "max_devices": llama_cpp.llama_max_devices(),
}

print("System capabilities:")
for capability, supported in capabilities.items():
    status = "✓" if supported else "✗"
    print(f"  {status} {capability}: {supported}")

# Timing utilities
start_time = llama_cpp.llama_time_us()
# ... some operation ...
end_time = llama_cpp.llama_time_us()
duration_ms = (end_time - start_time) / 1000
print(f"Operation took {duration_ms:.2f}ms")
print("constants", llama_cpp.LLAMA_DEFAULT_SEED, llama_cpp.LLAMA_TOKEN_NULL, llama_cpp.LLAMA_MAX_DEVICES,
      llama_cpp.LLAMA_SESSION_VERSION, llama_cpp.LLAMA_VOCAB_TYPE_BPE, llama_cpp.GGML_TYPE_Q4_1)
"""

SEED003_CUSTOM = """
import llamaplug.raw as llama_cpp
import ctypes

# Initialize backend
llama_cpp.llama_backend_init()

# Get and modify default parameters
model_params = llama_cpp.llama_model_default_params()
context_params = llama_cpp.llama_context_default_params()

# (the seed: "actual field names depend on structure"; this llama.h has load_mode for use_mmap/use_mlock)
model_params.n_gpu_layers = 35
model_params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP

context_params.n_ctx = 4096
context_params.n_batch = 512
context_params.n_threads = 8

print("Custom parameters configured")

try:
    # Load with custom parameters
    model = llama_cpp.llama_model_load_from_file(
        MODEL,
        model_params
    )

    if model:
        context = llama_cpp.llama_new_context_with_model(model, context_params)
        if context:
            print("Model and context created with custom parameters")

            # Get actual values
            actual_ctx = llama_cpp.llama_n_ctx(context)
            actual_embd = llama_cpp.llama_n_embd(model)
            print(f"Actual context size: {actual_ctx}")
            print(f"Actual embedding dimensions: {actual_embd}")

            llama_cpp.llama_free(context)
        llama_cpp.llama_model_free(model)

finally:
    llama_cpp.llama_backend_free()
"""

SEED003_MEMORY = """
import llamaplug.raw as llama_cpp
import gc
import psutil
import os

def get_memory_usage():
    process = psutil.Process(os.getpid())
    return process.memory_info().rss / 1024 / 1024

class LowLevelLlama:
    def __init__(self):
        self.model = None
        self.context = None
        self.backend_initialized = False

    def initialize_backend(self):
        if not self.backend_initialized:
            llama_cpp.llama_backend_init()
            self.backend_initialized = True

    def load_model(self, model_path: str):
        self.initialize_backend()
        if self.model:
            self.free_model()
        initial_memory = get_memory_usage()
        model_params = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(
            model_path.encode('utf-8'),
            model_params
        )
        if not self.model:
            raise RuntimeError(f"Failed to load model: {model_path}")
        final_memory = get_memory_usage()
        memory_increase = final_memory - initial_memory
        print(f"Model loaded: {memory_increase:.1f}MB memory increase")
        return True

    def create_context(self):
        if not self.model:
            raise RuntimeError("Model must be loaded first")
        if self.context:
            self.free_context()
        context_params = llama_cpp.llama_context_default_params()
        self.context = llama_cpp.llama_new_context_with_model(
            self.model,
            context_params
        )
        if not self.context:
            raise RuntimeError("Failed to create context")
        print("Context created successfully")
        return True

    def free_context(self):
        if self.context:
            llama_cpp.llama_free(self.context)
            self.context = None
            gc.collect()

    def free_model(self):
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None
            gc.collect()

    def cleanup(self):
        self.free_context()
        self.free_model()
        if self.backend_initialized:
            llama_cpp.llama_backend_free()
            self.backend_initialized = False

    def __del__(self):
        self.cleanup()

llama = LowLevelLlama()

try:
    print(f"Initial memory: {get_memory_usage():.1f}MB")
    llama.load_model(MODEL.decode())
    print(f"After model load: {get_memory_usage():.1f}MB")
    llama.create_context()
    print(f"After context creation: {get_memory_usage():.1f}MB")
finally:
    llama.cleanup()
    print(f"After cleanup: {get_memory_usage():.1f}MB")
"""

SEED003_ERRORS = """
import llamaplug.raw as llama_cpp
import ctypes

def validate_model_file(file_path: str) -> bool:
    import os
    if not os.path.exists(file_path):
        print(f"Model file not found: {file_path}")
        return False
    file_size = os.path.getsize(file_path)
    if file_size < 1024:
        print(f"Model file too small: {file_size} bytes")
        return False
    if not file_path.lower().endswith(('.gguf', '.ggml', '.bin')):
        print(f"Unexpected file extension: {file_path}")
        return False
    return True

def safe_model_loading(model_path: str):
    if not validate_model_file(model_path):
        return None
    llama_cpp.llama_backend_init()
    try:
        if not llama_cpp.llama_supports_mmap():
            print("Warning: Memory mapping not supported")
        model_params = llama_cpp.llama_model_default_params()
        print(f"Loading model: {model_path}")
        model = llama_cpp.llama_model_load_from_file(
            model_path.encode('utf-8'),
            model_params
        )
        if not model:
            print("Model loading failed - check file format and permissions")
            return None
        try:
            context_params = llama_cpp.llama_context_default_params()
            context = llama_cpp.llama_new_context_with_model(model, context_params)
            if context:
                n_ctx = llama_cpp.llama_n_ctx(context)
                n_embd = llama_cpp.llama_n_embd(model)
                print(f"Model validation successful:")
                print(f"  Context size: {n_ctx}")
                print(f"  Embeddings: {n_embd}")
                llama_cpp.llama_free(context)
                return model
            else:
                print("Context creation failed - insufficient memory?")
                llama_cpp.llama_model_free(model)
                return None
        except Exception as e:
            print(f"Model validation error: {e}")
            llama_cpp.llama_model_free(model)
            return None
    except Exception as e:
        print(f"Unexpected error during model loading: {e}")
        return None
    finally:
        pass

model = safe_model_loading(MODEL.decode())
if model:
    print("Model ready for use")
    llama_cpp.llama_model_free(model)

print(safe_model_loading("./models/missing-model.gguf"))
llama_cpp.llama_backend_free()
"""

SEED003_PERF = """
import llamaplug.raw as llama_cpp
import time
import contextlib
import os, psutil

def get_memory_usage():
    return psutil.Process(os.getpid()).memory_info().rss / 1024 / 1024

@contextlib.contextmanager
def performance_monitor(operation_name: str):
    start_time = llama_cpp.llama_time_us()
    start_memory = get_memory_usage()
    try:
        yield
    finally:
        end_time = llama_cpp.llama_time_us()
        end_memory = get_memory_usage()
        duration_ms = (end_time - start_time) / 1000
        memory_change = end_memory - start_memory
        print(f"{operation_name}:")
        print(f"  Duration: {duration_ms:.2f}ms")
        print(f"  Memory change: {memory_change:+.1f}MB")

llama_cpp.llama_backend_init()

try:
    with performance_monitor("Model Loading"):
        model_params = llama_cpp.llama_model_default_params()
        model = llama_cpp.llama_model_load_from_file(
            MODEL,
            model_params
        )

    if model:
        with performance_monitor("Context Creation"):
            context_params = llama_cpp.llama_context_default_params()
            context = llama_cpp.llama_new_context_with_model(model, context_params)

        if context:
            with performance_monitor("Model Info Retrieval"):
                n_ctx = llama_cpp.llama_n_ctx(context)
                n_embd = llama_cpp.llama_n_embd(model)
                print(f"Context: {n_ctx}, Embeddings: {n_embd}")

            llama_cpp.llama_free(context)

        llama_cpp.llama_model_free(model)

finally:
    llama_cpp.llama_backend_free()
"""


@pytest.mark.parametrize(("example", "expected"), [
    (SEED003_BASIC, ["Model loaded successfully", "Context created successfully", "Embedding dimensions: 576",
                     "Cleanup completed"]),
    (SEED003_CAPABILITIES, ["mmap_support: True", "max_devices:", "Operation took",
                            "constants 4294967295 -1"]),
    (SEED003_CUSTOM, ["Model and context created with custom parameters", "Actual context size: 4096",
                      "Actual embedding dimensions: 576"]),
    (SEED003_MEMORY, ["Model loaded:", "Context created successfully", "After cleanup:"]),
    (SEED003_ERRORS, ["Model validation successful:", "Embeddings: 576", "Model ready for use",
                      "Model file not found: ./models/missing-model.gguf"]),
    (SEED003_PERF, ["Model Loading:", "Context Creation:", "Context: 512, Embeddings: 576"]),
], ids=["basic-setup", "capabilities", "custom-params", "memory-management", "error-handling", "performance"])
def test_seed003_raw_examples(smollm2_path, example, expected):
    done = run_isolated(f"MODEL = {str(smollm2_path).encode()!r}\n" + example)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-3000:]}"
    for line in expected:
        assert line in done.stdout, f"{line!r} not in:\n{done.stdout}"


# -- seed 004: the Context API ---------------------------------------------------------------


@pytest.fixture(scope="module")
def model(smollm2_path):
    model = lp.LlamaModel.load(smollm2_path)
    yield model
    model.close()


def test_seed004_context_new_and_builder(model):
    params = lp.ContextParams()
    params.n_ctx = 4096
    params.n_batch = 512
    params.n_threads = 8
    ctx = lp.LlamaContext(model, params)
    assert (ctx.n_ctx, ctx.n_batch) == (4096, 512)

    ctx2 = (lp.ContextBuilder(model)
            .context_size(4096)
            .batch_size(512)
            .threads(8)
            .embeddings(True)
            .flash_attention(True)
            .kv_cache_type(lp.KvCacheType.Q8_0)
            .build())
    assert ctx2.params.type_k == ctx2.params.type_v == lp.KvCacheType.Q8_0
    assert ctx2.params.flash_attn_type == lp.FlashAttnType.ENABLED and ctx2.params.embeddings
    with pytest.raises(lp.InvalidParameterError) as err:
        lp.ContextBuilder(model).threads(100000)
    assert err.value.field == "n_threads"
    ctx.close()
    ctx2.close()


def test_seed004_generate_and_generate_with_params(model):
    ctx = lp.LlamaContext(model, lp.ContextParams(n_ctx=2048, n_threads=THREADS))
    tokens = model.tokenize("Once upon a time", True, False)
    output = ctx.generate(tokens, 100)
    assert isinstance(output, str) and output

    params = lp.SamplerParams(temperature=0.7, top_k=50, top_p=0.9, penalty_repeat=1.1)
    output = ctx.generate_with_params(tokens, 100, params)
    assert isinstance(output, str) and output
    ctx.close()


def test_seed004_token_level_operations(model):
    ctx = lp.LlamaContext(model, lp.ContextParams(n_ctx=512, n_threads=THREADS))
    tokens = model.tokenize("Hello, world!", True, False)
    ctx.decode(tokens)
    assert ctx.get_logits_ith(-1).shape == (model.n_vocab,) and ctx.get_logits().shape == (1, model.n_vocab)
    nxt = int(np.argmax(ctx.get_logits_ith(-1)))
    ctx.decode_single(nxt)
    ctx.clear_cache()
    ctx.eval(tokens, 0)
    assert ctx.n_past == len(tokens)
    assert ctx.kv_cache_seq_rm(0, 2, -1) and ctx.n_past == 2
    ctx.close()


def test_seed004_complete_generation_example(model):
    params = lp.ContextParams(n_ctx=2048, n_batch=512, n_threads=THREADS,
                              type_k=lp.KvCacheType.Q8_0, type_v=lp.KvCacheType.Q8_0)
    ctx = lp.LlamaContext(model, params)
    sampler_params = lp.SamplerParams(temperature=0.7, top_k=40, top_p=0.9, penalty_repeat=1.1, seed=7)
    sampler = sampler_params.build_chain(model)

    prompt = "The meaning of life is"
    tokens = model.tokenize(prompt, True, False)
    ctx.decode(tokens)
    pieces = [prompt]
    for _ in range(100):
        next_token = sampler.sample(ctx, -1)
        sampler.accept(next_token)
        if model.token_is_eog(next_token):
            break
        text = model.token_to_str(next_token, 0, False)
        pieces.append(text)
        ctx.decode_single(next_token)
    assert len(pieces) > 1 and "".join(pieces).startswith(prompt)
    ctx.close()


def test_seed004_token_to_str_lstrip(model):
    token = model.tokenize(" Paris", add_bos=False)[0]
    assert model.token_to_str(token, 0, False) == " Paris"
    assert model.token_to_str(token, 1, False) == "Paris"


def test_seed004_kv_cache_seq_shift_as_a_sliding_window(model):
    """Fill a small window, drop the oldest tokens after a kept prefix, shift the rest left, decode on."""
    n_ctx, n_keep = 64, 4
    ctx = lp.LlamaContext(model, lp.ContextParams(n_ctx=n_ctx, n_threads=THREADS))
    ctx.decode(model.tokenize("Once upon a time, in a land far away,", True, False))
    generated = 0
    while generated < 2 * n_ctx:  # twice the window: it slides at least twice
        if ctx.n_past >= n_ctx:
            n_discard = (ctx.n_past - n_keep) // 2
            assert ctx.kv_cache_seq_rm(0, n_keep, n_keep + n_discard)
            ctx.kv_cache_seq_shift(0, n_keep + n_discard, ctx.n_past, -n_discard)
            assert ctx.n_past == ctx.kv_cache_seq_pos_max(0) + 1 == n_ctx - n_discard
        token = int(np.argmax(ctx.get_logits_ith(-1)))
        ctx.decode_single(token)
        generated += 1
    assert np.isfinite(ctx.get_logits_ith(-1)).all()
    ctx.close()


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(p || q) of the two softmax distributions."""
    p, q = (x.astype(np.float64) - x.max() for x in (p_logits, q_logits))
    log_p, log_q = p - np.log(np.exp(p).sum()), q - np.log(np.exp(q).sum())
    return float((np.exp(log_p) * (log_p - log_q)).sum())


def _positions_moved_without_rotating(state: bytes, by: int, n: int) -> bytes:
    """A sequence state (llama_state_seq_get_data of the pin) whose n cells say positions moved by `by` while
    their keys keep the rotation of the old ones: what a shift that forgot llama.cpp's K-shift would leave.
    The layout is read as it is checked (magic, seq id, streams, cells; per cell: pos, n_seq_id, seq id)."""
    data = bytearray(state)
    n_stream, count = struct.unpack_from("<II", data, 8)
    assert (n_stream, count) == (1, n), (n_stream, count)
    for i in range(count):
        pos, n_seq, seq = struct.unpack_from("<iIi", data, 16 + 12 * i)
        assert (n_seq, seq) == (1, 0) and pos == i - by, (i, pos, n_seq, seq)
        struct.pack_into("<i", data, 16 + 12 * i, pos + by)
    return bytes(data)


@pytest.mark.parametrize("offset", [7, 300])
def test_kv_cache_seq_shift_equals_decoding_at_the_new_positions(model, offset):
    """Tokens decoded at offset.., shifted by -offset: the next token's distribution is that of the same tokens
    decoded afresh at 0.. (llama.cpp re-rotates the keys), up to the rounding of another position's RoPE; a
    cache whose positions moved but whose keys were not re-rotated is far from it."""
    tokens = list(model.tokenize("Once upon a time, in a land far away, there lived a king who had three "
                                 "daughters. The eldest was", True, False))
    following = model.tokenize(" very", add_bos=False)[0]

    def context() -> lp.LlamaContext:
        return lp.LlamaContext(model, lp.ContextParams(n_ctx=512, n_threads=THREADS))

    with context() as fresh, context() as shifted, context() as unrotated:
        fresh.decode(tokens + [following])
        shifted.eval(tokens, offset)
        state = shifted.state_seq_get(0)
        shifted.kv_cache_seq_shift(0, offset, offset + len(tokens), -offset)
        assert (shifted.kv_cache_seq_pos_min(0), shifted.kv_cache_seq_pos_max(0)) == (0, len(tokens) - 1)
        assert shifted.n_past == len(tokens)
        shifted.decode_single(following)
        unrotated.state_seq_set(_positions_moved_without_rotating(state, -offset, len(tokens)), 0)
        assert unrotated.n_past == len(tokens)
        unrotated.decode_single(following)
        want = fresh.get_logits_ith(-1)
        near, far = _kl(want, shifted.get_logits_ith(-1)), _kl(want, unrotated.get_logits_ith(-1))
        # Measured here: near 0.005-0.015 (fresh at 7 or 300 against fresh at 0 differs as much), far 2-4.
        assert near < 0.05 and far > 20 * near, (near, far)
