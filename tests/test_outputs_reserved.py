"""Reserved outputs (ContextParams.n_outputs_max): llama.cpp aborts the process on a batch asking for more logits
rows than the context reserved, so the context refuses it first; the server reserves one row per slot (and per
drafted token), as llama-server does, and the engine keeps its batches within them."""

from __future__ import annotations

from pathlib import Path

import pytest

import llamaplug as lp
from llamaplug.server.model_specs import spec_for_file

THREADS = 2


@pytest.fixture(scope="module")
def model(smollm2_path: Path):
    lp.LlamaBackend.init()
    with lp.LlamaModel(smollm2_path) as m:
        yield m


def test_a_batch_asking_for_more_outputs_than_reserved_is_refused_not_an_abort(model):
    params = lp.ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=2, n_outputs_max=2, n_threads=THREADS)
    with lp.LlamaContext(model, params) as ctx:
        assert ctx.n_outputs_max == 2
        tokens = model.tokenize("The capital of France is", add_bos=True)
        batch = lp.LlamaBatch(64, 1)
        batch.add_sequence(tokens, 0, True)  # a row of logits for every token: more than the 2 reserved
        with pytest.raises(lp.InvalidParameterError, match="n_outputs_max") as caught:
            ctx.decode(batch)
        assert caught.value.field == "batch.logits"
        batch.clear()
        batch.add_sequence(tokens, 0, False)  # the last token's row only
        batch.add_sequence(tokens, 1, False)
        ctx.decode(batch)  # two rows: within the reservation
        assert ctx.get_logits().shape == (2, model.n_vocab)


def test_fewer_outputs_than_sequences_cannot_be_reserved(model):
    # llama.cpp reserves a row per sequence when it makes the context, and aborts where that exceeds n_outputs_max
    with pytest.raises(lp.InvalidParameterError, match="n_outputs_max") as caught:
        lp.LlamaContext(model, lp.ContextParams(n_ctx=256, n_seq_max=4, n_outputs_max=2, n_threads=THREADS))
    assert caught.value.field == "n_outputs_max"


def test_the_default_reserves_n_batch_outputs(model):
    with lp.LlamaContext(model, lp.ContextParams(n_ctx=256, n_batch=32, n_ubatch=32, n_threads=THREADS)) as ctx:
        assert ctx.n_outputs_max == 32


def test_the_server_reserves_a_row_per_slot_and_drafted_token_as_llama_server(smollm2_path):
    assert spec_for_file(smollm2_path, {"n_seq_max": 4}).params.n_outputs_max == 4
    ngram = spec_for_file(smollm2_path, {"n_seq_max": 4, "speculative": "ngram", "draft_max": 8}).params
    assert ngram.n_outputs_max == 4 * (1 + 8)
    assert spec_for_file(smollm2_path, {"n_seq_max": 4, "n_outputs_max": 64}).params.n_outputs_max == 64


def test_drafts_shrink_to_the_reserved_outputs_and_the_output_stays_the_models(smollm2_path):
    """With one row per slot reserved, the n-gram drafter has no rows left to guess in: the engine drafts nothing
    (rather than a batch llama.cpp would abort on) and the text is the plain one."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 6
    base = {"n_ctx": 1024, "n_seq_max": 2, "n_threads": 1}
    with lp.Llama.load(lp.LlamaParams(smollm2_path, **base)) as plain:
        want = [c.tokens for c in plain.create_completions([prompt, "def fibonacci(n):"], max_tokens=24)]
    with lp.Llama.load(lp.LlamaParams(smollm2_path, **base, speculative="ngram", n_outputs_max=2)) as tight:
        got = tight.create_completions([prompt, "def fibonacci(n):"], max_tokens=24)
        assert [c.tokens for c in got] == want
        assert tight.engine.stats.drafted_tokens == 0
    with lp.Llama.load(lp.LlamaParams(smollm2_path, **base, speculative="ngram", n_outputs_max=2 * 5,
                                      draft_max=16)) as some:
        got = some.create_completions([prompt, "def fibonacci(n):"], max_tokens=24)
        assert [c.tokens for c in got] == want
        assert some.engine.stats.drafted_tokens > 0  # room for 4 guesses each, not the 16 asked for
