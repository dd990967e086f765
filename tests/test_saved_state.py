"""Llama.save_state / load_state: bytes and files, prefix reuse after a load, another model's state refused."""

from __future__ import annotations

import pytest
from fixtures.tiny_gguf import write_tiny_model
from llamaplug_testing import THREADS

import llamaplug as lp

SYSTEM = "Minutes of the garden club. The roses were pruned and the pond was cleaned. " * 4


@pytest.fixture(scope="module")
def two(smollm2_path):
    params = lp.LlamaParams(smollm2_path, n_ctx=1024, n_seq_max=2, n_threads=THREADS)
    with lp.Llama.load(params) as a, lp.Llama.load(params) as b:
        yield a, b


def test_a_loaded_state_is_reused_and_gives_the_same_text(two, tmp_path):
    a, b = two
    first = a.create_completion(SYSTEM + "Next, the members", max_tokens=12)
    data = a.save_state()
    assert isinstance(data, bytes) and data[:4] == b"LLPS"
    path = a.save_state(tmp_path / "garden.state")
    assert path.read_bytes() == data
    b.load_state(path)
    again = b.create_completion(SYSTEM + "Next, the members", max_tokens=12)
    assert again.text == first.text
    assert again.timings.cached_tokens == len(again.prompt_tokens) - 1  # only the last prompt token decoded
    b.load_state(data)  # bytes too
    assert b.create_completion(SYSTEM + "Then", max_tokens=4).timings.cached_tokens >= len(b.tokenize(SYSTEM)) - 2


def test_another_models_state_is_refused_where_llama_cpp_would_take_it(tmp_path):
    one = write_tiny_model(tmp_path / "one.gguf")
    other = write_tiny_model(tmp_path / "other.gguf", (("tokenizer.ggml.fim_pre_token_id", 3),))
    params = dict(n_ctx=64, n_threads=1)
    with lp.Llama.load(lp.LlamaParams(one, **params)) as a, lp.Llama.load(lp.LlamaParams(other, **params)) as b:
        a.create_completion("hello", max_tokens=2)
        data = a.save_state()
        native = a.context.state_get()
        b.context.state_set(native)  # llama.cpp checks sizes only: the same shapes load without a word
        with pytest.raises(lp.StateError, match="saved with another model: one.gguf .* not other.gguf"):
            b.load_state(data)


@pytest.mark.parametrize("mangle, match", [
    (lambda d: b"JUNK" + d[4:], "not a llamaplug state"),
    (lambda d: d[:8] + b"}" + d[9:], "damaged header"),
    (lambda d: d[:8 + int.from_bytes(d[4:8], "little")], "cut short"),
    (lambda d: d[:-100], "rejected the state"),
    (lambda d: b"", "not a llamaplug state"),
], ids=["magic", "header", "no_cache", "truncated_cache", "empty"])
def test_damaged_states_are_state_errors_and_the_llama_stays_usable(two, mangle, match):
    a, b = two
    a.create_completion(SYSTEM, max_tokens=2)
    with pytest.raises(lp.StateError, match=match):
        b.load_state(mangle(a.save_state()))
    want = a.create_completion("The pond", max_tokens=6).text
    assert b.create_completion("The pond", max_tokens=6).text == want


def test_a_context_of_another_shape_is_refused(two, smollm2_path):
    a, _ = two
    a.create_completion(SYSTEM, max_tokens=2)
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=1024, n_seq_max=4, n_threads=THREADS)) as wide:
        with pytest.raises(lp.StateError, match="n_seq_max=2; this one has n_ctx=1024, n_seq_max=4"):
            wide.load_state(a.save_state())


def test_missing_file(two, tmp_path):
    with pytest.raises(lp.StateError, match="not found"):
        two[0].load_state(tmp_path / "nope.state")


def test_one_sequence_moves_to_another_through_bytes(smollm2_path):
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=512, n_seq_max=2, n_threads=THREADS,
                                      cache_ram_mib=0)) as llama:
        ctx, tokens = llama.context, llama.tokenize(SYSTEM)
        batch = lp.LlamaBatch(len(tokens), 1)

        def last_token_logits(seq: int):
            batch.clear()
            batch.add(tokens[-1], len(tokens) - 1, seq, True)
            ctx.decode(batch)
            return ctx.get_logits_ith(-1).copy()

        batch.add_sequence(tokens[:-1], 0)
        ctx.decode(batch)
        data = ctx.state_seq_get(0)
        want = last_token_logits(0)
        ctx.kv_cache_seq_rm(0, -1, -1)
        ctx.state_seq_set(data, 1)  # into the other sequence
        assert ctx.kv_cache_seq_pos_max(1) == len(tokens) - 2 and ctx.kv_cache_seq_pos_max(0) == -1
        assert abs(last_token_logits(1) - want).max() < 1e-4
        with pytest.raises(lp.StateError, match="sequence 0"):
            ctx.state_seq_set(data[: len(data) // 2], 0)
        with pytest.raises(lp.StateError):
            ctx.state_seq_set(b"", 0)
        with pytest.raises(lp.InvalidParameterError, match="seq_id 5"):
            ctx.state_seq_get(5)
        assert llama.create_completion("Hello", max_tokens=2).text  # still usable
