"""LlamaBatch + LlamaContext with the real SmolLM2 model: multi-sequence decode, KV cache ops, state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import llamaplug as lp

THREADS = 2
ATOL = 1e-3
N_CTX = 512
N_BATCH = 64

PROMPT_A = "The capital of France is"
PROMPT_B = "def fibonacci(n):\n    return"


@pytest.fixture(scope="module")
def model(smollm2_path: Path):
    lp.LlamaBackend.init()
    with lp.LlamaModel(smollm2_path) as m:
        yield m


@pytest.fixture
def ctx(model):
    params = lp.ContextParams(n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, n_seq_max=2, n_threads=THREADS)
    with lp.LlamaContext(model, params) as c:
        yield c


@pytest.fixture(scope="module")
def prompts(model) -> tuple[list[int], list[int]]:
    a = model.tokenize(PROMPT_A, add_bos=True)
    b = model.tokenize(PROMPT_B, add_bos=True)
    assert len(a) != len(b) or a != b
    return a, b


def _alone(ctx: lp.LlamaContext, tokens: list[int]) -> np.ndarray:
    """Next-token logits of `tokens` decoded alone, as sequence 0, in a cleared context."""
    ctx.clear_cache()
    batch = lp.LlamaBatch(len(tokens), 1)
    batch.add_sequence(tokens, 0)
    ctx.decode(batch)
    return ctx.get_logits_ith(-1).copy()


def _max_diff(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.max(np.abs(x - y)))


def test_two_sequences_in_one_batch_match_each_alone(ctx, prompts):
    a, b = prompts
    batch = lp.LlamaBatch(len(a) + len(b), 1)
    batch.add_sequence(a, seq_id=0)
    batch.add_sequence(b, seq_id=1)
    assert len(batch) == len(a) + len(b)
    ctx.decode(batch)
    both_a = ctx.get_logits_ith(len(a) - 1).copy()
    both_b = ctx.get_logits_ith(len(a) + len(b) - 1).copy()
    assert ctx.kv_cache_seq_pos_max(0) == len(a) - 1
    assert ctx.kv_cache_seq_pos_max(1) == len(b) - 1
    # only the last token of each sequence asked for logits
    with pytest.raises(lp.InvalidParameterError):
        ctx.get_logits_ith(0)

    alone_a = _alone(ctx, a)
    alone_b = _alone(ctx, b)
    assert np.allclose(both_a, alone_a, atol=ATOL), f"seq 0 differs by {_max_diff(both_a, alone_a)}"
    assert np.allclose(both_b, alone_b, atol=ATOL), f"seq 1 differs by {_max_diff(both_b, alone_b)}"
    # the two prompts really predict different things, so the comparison above means something
    assert not np.allclose(alone_a, alone_b, atol=ATOL)
    assert int(np.argmax(alone_a)) != int(np.argmax(alone_b))


def test_seq_rm_then_redecode_gives_same_logits(ctx, prompts):
    a, _ = prompts
    before = _alone(ctx, a)
    k = 3
    assert ctx.kv_cache_seq_rm(0, len(a) - k, -1)
    assert ctx.kv_cache_seq_pos_max(0) == len(a) - k - 1
    assert ctx.n_past == len(a) - k

    batch = lp.LlamaBatch(k, 1)
    batch.add_sequence(a[-k:], 0, pos0=len(a) - k)
    ctx.decode(batch)
    after = ctx.get_logits_ith(-1)
    assert ctx.kv_cache_seq_pos_max(0) == len(a) - 1
    assert np.allclose(after, before, atol=ATOL), f"re-decoded logits differ by {_max_diff(after, before)}"

    # removing the whole sequence empties it
    assert ctx.kv_cache_seq_rm(0)
    assert ctx.kv_cache_seq_pos_max(0) == -1
    assert ctx.n_past == 0


def test_seq_cp_then_same_token_gives_same_logits(ctx, prompts):
    a, _ = prompts
    _alone(ctx, a)
    assert ctx.kv_cache_seq_pos_max(1) == -1
    ctx.kv_cache_seq_cp(0, 1)

    nxt = a[1]  # any token: the same one on both sequences
    batch = lp.LlamaBatch(2, 2)
    batch.add(nxt, len(a), (0,), True)
    batch.add(nxt, len(a), (1,), True)
    ctx.decode(batch)
    on0 = ctx.get_logits_ith(0).copy()
    on1 = ctx.get_logits_ith(1).copy()
    assert ctx.kv_cache_seq_pos_max(1) == len(a)
    assert np.allclose(on0, on1, atol=ATOL), f"copied sequence differs by {_max_diff(on0, on1)}"

    # and both equal the whole thing decoded alone: the copy carried the prompt's cache
    ref = _alone(ctx, a + [nxt])
    assert np.allclose(on1, ref, atol=ATOL), f"copy vs reference differs by {_max_diff(on1, ref)}"
    # the same token on an empty sequence (no prompt) predicts something else
    ctx.clear_cache()
    ctx.decode(lp.LlamaBatch.one(nxt, 0, seq_id=1))
    assert not np.allclose(ctx.get_logits_ith(-1), on1, atol=ATOL)


def test_state_round_trip_restores_logits(ctx, prompts):
    """The state holds the KV cache: after further decoding, state_set brings the logits of the next step back."""
    a, b = prompts
    prompt_logits = _alone(ctx, a)
    next_tok = int(np.argmax(prompt_logits))
    state = ctx.state_get()
    assert isinstance(state, bytes) and len(state) > 0

    ctx.decode(lp.LlamaBatch.one(next_tok, len(a)))
    first = ctx.get_logits_ith(-1).copy()
    assert not np.allclose(first, prompt_logits, atol=ATOL)

    # decode more: the cache and the logits move on
    ctx.eval(b[1:], ctx.n_past)
    moved = ctx.get_logits_ith(-1).copy()
    assert ctx.n_past == len(a) + 1 + len(b) - 1
    assert ctx.kv_cache_seq_pos_max(0) == ctx.n_past - 1
    assert not np.allclose(moved, first, atol=ATOL)

    ctx.state_set(state)
    assert ctx.n_past == len(a)
    assert ctx.kv_cache_seq_pos_max(0) == len(a) - 1

    ctx.decode(lp.LlamaBatch.one(next_tok, ctx.n_past))
    again = ctx.get_logits_ith(-1).copy()
    assert np.allclose(again, first, atol=ATOL), f"logits after state_set differ by {_max_diff(again, first)}"
    ref = _alone(ctx, a + [next_tok])
    assert np.allclose(again, ref, atol=ATOL), f"logits after state_set vs fresh differ by {_max_diff(again, ref)}"

    # a state restores into another context of the same model too
    params = lp.ContextParams(n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, n_seq_max=2, n_threads=THREADS)
    with lp.LlamaContext(ctx.model, params) as other:
        other.state_set(state)
        assert other.n_past == len(a)
        other.decode(lp.LlamaBatch.one(next_tok, other.n_past))
        elsewhere = other.get_logits_ith(-1)
        diff = _max_diff(elsewhere, first)
        assert np.allclose(elsewhere, first, atol=ATOL), f"state in a new context differs by {diff}"


def test_get_logits_ith_is_a_numpy_view(ctx, prompts, model):
    a, _ = prompts
    _alone(ctx, a)
    x = ctx.get_logits_ith(-1)
    y = ctx.get_logits_ith(len(a) - 1)
    assert isinstance(x, np.ndarray)
    assert x.dtype == np.float32
    assert x.shape == (model.n_vocab,) == (ctx.n_vocab,)
    assert not x.flags.owndata and x.base is not None
    assert np.shares_memory(x, y)
    assert np.isfinite(x).all() and float(x.std()) > 0


def test_batch_overflow_raises(ctx, model):
    batch = lp.LlamaBatch(2, 1)
    batch.add(1, 0)
    batch.add(2, 1)
    with pytest.raises(lp.InvalidParameterError, match="overflow"):
        batch.add(3, 2)
    assert len(batch) == 2

    batch.clear()
    with pytest.raises(lp.InvalidParameterError, match="overflow"):
        batch.add_sequence([1, 2, 3], 0)
    assert len(batch) == 0

    # more tokens than the context's n_batch: refused before llama_decode
    big = lp.LlamaBatch(N_BATCH + 1, 1)
    big.add_sequence([1] * (N_BATCH + 1), 0)
    with pytest.raises(lp.InvalidParameterError, match="n_batch"):
        ctx.decode(big)

    # a sequence id beyond the context's n_seq_max
    bad_seq = lp.LlamaBatch(1, 1)
    bad_seq.add(1, 0, (2,), True)
    with pytest.raises(lp.InvalidParameterError, match="seq_id"):
        ctx.decode(bad_seq)

    # a token outside the vocabulary
    bad_tok = lp.LlamaBatch.one(model.n_vocab, 0)
    with pytest.raises(lp.InvalidTokenError):
        ctx.decode(bad_tok)


def test_batch_one_decodes(ctx, prompts):
    a, _ = prompts
    one = lp.LlamaBatch.one(a[0], 0)
    assert len(one) == 1 and one.token[0] == a[0] and one.pos[0] == 0 and one.logits[0] == 1

    ctx.clear_cache()
    for pos, tok in enumerate(a):
        ctx.decode(lp.LlamaBatch.one(tok, pos))
    stepwise = ctx.get_logits_ith(-1).copy()
    assert ctx.n_past == len(a)
    assert ctx.kv_cache_seq_pos_max(0) == len(a) - 1

    ref = _alone(ctx, a)
    assert np.allclose(stepwise, ref, atol=ATOL), f"token-by-token differs by {_max_diff(stepwise, ref)}"


def test_rejected_state_leaves_n_past_matching_the_cache(ctx, prompts):
    # A state cut short passes the header check, then llama.cpp gives up part-way through the
    # cache; n_past must follow what the cache holds then, not what it held before.
    a, b = prompts
    _alone(ctx, a)
    state = ctx.state_get()
    ctx.eval(b, ctx.n_past)
    before = ctx.n_past
    assert before == len(a) + len(b)
    with pytest.raises(lp.StateError, match="rejected the state"):
        ctx.state_set(state[: len(state) // 2])
    assert ctx.n_past == ctx.kv_cache_seq_pos_max(0) + 1
    with pytest.raises(lp.InvalidParameterError, match="no logits"):
        ctx.get_logits_ith(-1)  # nothing decoded since: no stale logits
    ctx.clear_cache()
    ctx.eval(a, 0)  # the context still works
    assert ctx.n_past == len(a)
