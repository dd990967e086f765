"""Backend probes, model metadata/save, context state and perf, native logging, hooks, the raw layer."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
from llamaplug_testing import THREADS, run_isolated

import llamaplug as lp
from llamaplug import raw


def test_backend_is_one_guard_per_process():
    a = lp.LlamaBackend.init()
    with lp.LlamaBackend.init() as b:
        assert a is b
    assert lp.LlamaBackend.initialised()  # leaving the block keeps the native state for live models


def test_backend_probes_and_devices():
    backend = lp.LlamaBackend.init()
    assert backend.supports_mmap() is True
    # llama.cpp counts RPC as offload: true exactly when a non-CPU backend is loaded.
    assert backend.supports_gpu_offload() is any(s.loaded and s.name != "cpu" for s in backend.backends())
    assert backend.max_devices() >= 1
    cpu = [d for d in backend.devices() if d.type == "cpu"]
    assert cpu and cpu[0].memory_total > 0 and 0 < cpu[0].memory_free <= cpu[0].memory_total
    assert "CPU" in backend.system_info()


def test_numa_is_initialised_once():
    r = run_isolated("""
import llamaplug as lp
b = lp.LlamaBackend.init_numa(lp.NumaStrategy.DISTRIBUTE)
assert b.numa is lp.NumaStrategy.DISTRIBUTE and lp.LlamaBackend.init_numa(1) is b
try:
    lp.LlamaBackend.init_numa(lp.NumaStrategy.ISOLATE)
except lp.BackendError as e:
    print("OK", e)
""")
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout and "DISTRIBUTE" in r.stdout


def test_model_without_backend_init_is_an_error(smollm2_path):
    r = run_isolated(f"""
import llamaplug as lp
try:
    lp.LlamaModel({str(smollm2_path)!r})
except lp.BackendNotInitialisedError as e:
    print("OK", e)
""")
    assert r.returncode == 0 and "OK" in r.stdout and "LlamaBackend.init()" in r.stdout


def test_model_properties(llama):
    m = llama.model
    md = m.metadata
    assert md["general.architecture"] == "llama"
    assert int(md["llama.block_count"]) == m.n_layer == 30
    assert int(md["llama.embedding_length"]) == m.n_embd
    assert m.n_ctx_train == int(md["llama.context_length"])
    assert m.n_vocab == 49152 and 100e6 < m.n_params < 200e6 and m.size > 50e6
    assert "llama" in m.desc.lower()
    assert "<|im_start|>" in m.chat_template
    assert m.eos is not None and m.token_is_eog(m.eos)
    assert m.token_to_str(m.tokenize("Paris", add_bos=False)[0]) == "Paris"
    assert m.tokenize("<|im_start|>", add_bos=False, special=True) != m.tokenize("<|im_start|>", add_bos=False)


def test_per_token_answers_are_remembered_without_changing_them(llama, smollm2_path):  # llama: backend init
    # token_to_piece / token_is_eog keep what llama.cpp answered (generation asks once per token);
    # the control-token text of special=True is never served to special=False, and a closed
    # model still says so.
    model = lp.LlamaModel(smollm2_path, lp.ModelParams(vocab_only=True))
    eos, paris = model.eos, model.tokenize("Paris", add_bos=False)[0]

    def native_piece(token: int, special: bool) -> bytes:
        buf = raw.ffi.new("char[]", 64)
        return raw.ffi.unpack(buf, raw.lib.llama_token_to_piece(model._vocab, token, buf, 64, 0, special))

    for _ in range(2):  # the second round is served from what the first stored
        assert model.token_to_piece(eos) == native_piece(eos, False) == b""
        assert model.token_to_piece(eos, special=True) == native_piece(eos, True) == b"<|im_end|>"
        assert model.token_to_piece(paris) == native_piece(paris, False) == b"Paris"
        assert model.token_is_eog(eos) and not model.token_is_eog(paris)
    with pytest.raises(lp.InvalidTokenError):
        model.token_is_eog(model.n_vocab)
    model.close()
    for call in (lambda: model.token_to_piece(paris), lambda: model.token_is_eog(eos)):
        with pytest.raises(lp.ClosedError):
            call()


def test_model_save_roundtrip(llama, tmp_path):
    target = llama.model.save(tmp_path / "copy.gguf")
    copy = lp.LlamaModel(target, lp.ModelParams(vocab_only=True))
    try:
        assert copy.n_vocab == llama.model.n_vocab
        assert copy.tokenize("Round trip, ünïcödé") == llama.tokenize("Round trip, ünïcödé")
    finally:
        copy.close()


def test_state_file_roundtrip(llama, tmp_path):
    ctx = llama.context
    tokens = llama.tokenize("The state of the cache")
    ctx.clear_cache()
    ctx.eval(tokens, 0)
    saved = ctx.state_save_file(tmp_path / "state.bin", tokens)
    nxt = int(np.argmax(ctx.get_logits_ith(-1)))
    ctx.decode_single(nxt)
    after_one = ctx.get_logits_ith(-1).copy()
    ctx.clear_cache()
    assert ctx.state_load_file(saved) == tokens and ctx.n_past == len(tokens)
    ctx.decode_single(nxt)
    assert np.allclose(ctx.get_logits_ith(-1), after_one, atol=1e-3)


def test_perf_counters(llama):
    ctx = llama.context
    ctx.perf_reset()
    llama.create_completion("Count the tokens", max_tokens=6)
    perf = ctx.perf()
    assert perf["n_eval"] == 5  # the last sampled token is not decoded
    assert perf["n_p_eval"] == len(llama.tokenize("Count the tokens"))
    assert perf["t_eval_ms"] > 0


def test_native_log_goes_to_logging(smollm2_path, caplog):
    level = lp.blocks._native_log.log.level
    lp.blocks._native_log.set_level("info")
    try:
        with caplog.at_level(logging.INFO, logger="llamaplug.native"):
            model = lp.LlamaModel(smollm2_path, lp.ModelParams(vocab_only=True))
            model.close()
    finally:
        lp.blocks._native_log.set_level("error")
        lp.blocks._native_log.log.setLevel(level)  # set_level only lowers it: else INFO for every later test file
    native = [r for r in caplog.records if r.name == "llamaplug.native"]
    assert any("llama_model_loader" in r.getMessage() or "print_info" in r.getMessage() for r in native)


def test_native_log_captures_of_two_threads_may_end_in_any_order():
    # Two models' engines decode at once (serve --models-dir), each decode inside a capture; the later capture ends
    # first, then a line reaches the earlier one. list.remove took the earlier's equal list for the later's, and the
    # earlier's end raised ValueError: its engine failed the step ("list.remove(x): x not in list" at shutdown).
    log = lp.blocks._native_log
    first, second = log.capture_errors(), log.capture_errors()
    first_lines, second_lines = first.__enter__(), second.__enter__()
    second.__exit__(None, None, None)
    assert any(held is first_lines for held in log._captures)
    first_lines.append("a warning of the first decode")  # as the log callback appends to each open capture
    first.__exit__(None, None, None)
    assert not any(held is first_lines or held is second_lines for held in log._captures)


def test_hooks_see_models_and_contexts(smollm2_path):
    seen = []

    class Watcher:
        @lp.hookimpl
        def llamaplug_model_loaded(model):
            seen.append(("model", model.n_vocab))

        @lp.hookimpl
        def llamaplug_context_created(context):
            seen.append(("context", context.n_ctx))

    from llamaplug.plugins import pm

    pm.register(Watcher, name="watcher")
    try:
        with lp.Llama.load(lp.LlamaParams(model_path=smollm2_path, n_ctx=512, n_threads=THREADS)):
            pass
    finally:
        pm.unregister(name="watcher")
    assert seen == [("model", 49152), ("context", 512)]


def test_raw_layer_declares_every_llama_api_function(llama_cpp_dir):
    header = (llama_cpp_dir / "include" / "llama.h").read_text()
    header = re.sub(r"//[^\n]*|/\*.*?\*/", "", header, flags=re.S)  # commented-out declarations don't count
    names = set(re.findall(r"LLAMA_API\s+[^;(]*?\b(llama_\w+)\s*\(", header))
    names |= set(re.findall(r"DEPRECATED\(\s*LLAMA_API\s+[^;(]*?\b(llama_\w+)\s*\(", header))
    assert len(names) > 200
    missing = sorted(n for n in names if not hasattr(raw.lib, n))
    assert missing == []
    assert raw.llama_max_devices() >= 1 and raw.ffi.string(raw.llama_print_system_info())


def test_sampler_chain_composes(llama):
    chain = lp.SamplerChain().penalties(64, 1.1).top_k(40).top_p(0.9).min_p(0.05).typical(1.0).temp(0.7).dist(7)
    assert chain.names == ["penalties", "top_k", "top_p", "min_p", "typical", "temp", "dist"]
    a = llama.create_completion("Tell me", max_tokens=12, sampler=chain).tokens
    again = lp.SamplerChain().penalties(64, 1.1).top_k(40).top_p(0.9).min_p(0.05).typical(1.0).temp(0.7).dist(7)
    assert llama.create_completion("Tell me", max_tokens=12, sampler=again).tokens == a  # same seed, same text
    assert len(chain) == 7
    with pytest.raises(lp.InvalidParameterError):
        lp.SamplerChain().top_p(1.5)


def test_greedy_fast_path_picks_what_llama_cpp_greedy_picks(llama):
    # The greedy chain skips llama_sampler_sample (argmax over the logits view); compare it
    # with llama.cpp's own greedy sampler on every output of a real batch, then on ties.
    ctx, model = llama.context, llama.model
    tokens = model.tokenize("The capital of France is Paris, and the capital of Italy is", True, False)
    batch = lp.LlamaBatch(len(tokens), 1)
    batch.add_sequence(np.asarray(tokens), 0, True, 0)
    ctx.clear_cache()
    ctx.decode(batch)
    native = raw.lib.llama_sampler_init_greedy()
    try:
        def reference(i: int) -> int:
            return int(raw.lib.llama_sampler_sample(native, ctx._ptr, i))

        picks = [lp.SamplerChain().greedy().sample(ctx, i) for i in range(len(tokens))]
        assert picks == [reference(i) for i in range(len(tokens))]
        assert len(set(picks)) > 3  # real, varied predictions, not one constant
        assert lp.LlamaSampler.greedy().sample(ctx, -1) == reference(-1)
        row = ctx.get_logits_ith(-1)  # a writable view of llama.cpp's buffer: make ties
        row[:] = -1.0
        row[[901, 77, 4000]] = 3.0
        assert reference(-1) == 77
        assert lp.SamplerChain().greedy().sample(ctx, -1) == 77
    finally:
        raw.lib.llama_sampler_free(native)
        ctx.clear_cache()
