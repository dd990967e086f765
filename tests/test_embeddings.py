"""Embeddings against the pin's native llama-embedding, batching, pooling none, long texts."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from llamaplug_testing import THREADS

import llamaplug as lp

TEXTS = ["Hello world", "The capital of France is Paris.", "Embeddings from llama.cpp", "x",
         "A somewhat longer sentence, with punctuation; and a few more words in it."]


@pytest.mark.parametrize("pooling", ["mean", "last", "cls"])
def test_same_vectors_as_native_llama_embedding(llama, native_tools, smollm2_path, pooling):
    done = subprocess.run([str(native_tools / "llama-embedding"), "-m", str(smollm2_path), "-p", "\n".join(TEXTS),
                           "--pooling", pooling, "--embd-output-format", "json", "-t", str(THREADS), "-c", "2048"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    reference = np.array([d["embedding"] for d in json.loads(done.stdout)["data"]], dtype=np.float32)
    ours = llama.embed(TEXTS, pooling=pooling)
    assert ours.shape == reference.shape == (len(TEXTS), llama.model.n_embd)
    np.testing.assert_allclose(ours, reference, atol=1e-4)


def test_many_texts_share_each_decode_and_give_the_same_vectors(llama):
    texts = [f"Sentence number {i} is about {w}." for i, w in enumerate(["cats", "dogs", "rain", "tea"] * 20)]
    one_by_one = np.stack([llama.embed([t], pooling="mean")[0] for t in texts])
    ctx = llama._embed_contexts[lp.PoolingType.MEAN]
    calls = []
    original = ctx.decode
    ctx.decode = lambda batch: (calls.append(batch.n_tokens), original(batch))[1]
    try:
        together = llama.embed(texts, pooling="mean")
    finally:
        del ctx.decode
    assert len(calls) == 2  # 80 texts, at most 64 sequences per decode
    # Not bit-equal: a batch of 80 texts runs other matrix kernels than a batch of one (as in llama.cpp).
    cosine = (together * one_by_one).sum(axis=1)
    assert cosine.min() > 0.999, cosine.min()


def test_pooling_none_gives_a_vector_per_token(llama):
    out = llama.embed(TEXTS[:3], pooling="none")
    assert [a.shape for a in out] == [(len(llama.model.tokenize(t)), llama.model.n_embd) for t in TEXTS[:3]]
    np.testing.assert_allclose(np.linalg.norm(out[1], axis=1), 1.0, rtol=1e-5)


def test_normalize(llama):
    raw = llama.embed(TEXTS[:2], normalize=False, pooling="mean")
    unit = llama.embed(TEXTS[:2], pooling="mean")
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-5)


def test_a_text_too_long_names_its_index_or_is_cut(llama):
    long = "word " * 3000
    with pytest.raises(lp.ContextOverflowError, match=r"texts\[1\]"):
        llama.embed(["short", long], pooling="mean")
    out = llama.embed(["short", long], pooling="mean", truncate=True)
    assert out.shape == (2, llama.model.n_embd)


@pytest.mark.parametrize("texts,pooling,field", [
    ("just a string", None, "texts"), ([], None, "texts"), (["ok", 3], None, "texts[1]"),
    (["ok"], "median", "pooling"),
])
def test_bad_embedding_input(llama, texts, pooling, field):
    with pytest.raises(lp.InvalidParameterError) as err:
        llama.embed(texts, pooling=pooling)
    assert err.value.field == field
