"""A real embedding model: all-MiniLM-L6-v2 converted by the pin's convert_hf_to_gguf.py (tests/fixtures/minilm.py).

Checked against an independent reference, sentence-transformers on CPU torch over the same
safetensors (its own tokenizer, mean pooling and normalisation, as the package's modules.json
says), and against the pin's native llama-embedding on the same GGUF.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from fixtures import minilm
from llamaplug_testing import THREADS

import llamaplug as lp
from llamaplug.raw import lib

TEXTS = [
    "The cat sits on the mat.",
    "A quick brown fox jumps over the lazy dog.",
    "How do I reset my password?",
    "Paris is the capital and most populous city of France.",
    "Café, naïve, résumé: accents are stripped by the uncased tokenizer.",
    "Ünïcödé ümlauts and ß in German: Straße, Grüße, Äpfel.",
    "日本語の文章も埋め込みできます。",
    "Emoji 🙂🚀 and symbols © ™ → ∑ mixed in.",
    "Москва — столица России.",
    "x",
    "   leading and trailing spaces   ",
    "GPU-accelerated inference with llama.cpp runs GGUF models; it supports CPU, CUDA, Vulkan and Metal back-ends.",
    # About 220 tokens: under sentence-transformers' max_seq_length of 256, where it would cut.
    " ".join(["A long-ish paragraph about rivers, mountains and the history of science in Europe."] * 12),
]
QUERY = "How can I change the password of my account?"
DOCS = [  # cosines with QUERY about 0.056, 0.43, -0.074, 0.66, 0.021, 0.24: no two within 0.03
    "Volcanoes erupt when magma rises to the surface.",
    "Forgot your login? Use the recovery link we send by email.",
    "The football match ended in a draw.",
    "To reset your password, open the settings page and choose security.",
    "The weather in Paris is mild in spring.",
    "Two-factor authentication adds a second step when you sign in.",
]


@pytest.fixture(scope="module")
def minilm_path(llama_cpp_dir):
    return minilm.gguf_path(llama_cpp_dir)


@pytest.fixture(scope="module")
def reference():
    return minilm.reference(TEXTS + [QUERY] + DOCS)


@pytest.fixture(scope="module")
def model(minilm_path):
    with lp.Llama.load(lp.LlamaParams(minilm_path, n_ctx=512, n_threads=THREADS)) as instance:
        yield instance


def unit(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def test_same_vectors_as_sentence_transformers(model, reference):
    assert reference["modules"] == ["Transformer", "Pooling", "Normalize"]
    ours = model.embed(TEXTS)
    theirs = np.array(reference["embeddings"][:len(TEXTS)])
    assert ours.shape == theirs.shape == (len(TEXTS), 384)
    cosine = (unit(ours) * unit(theirs)).sum(axis=1)
    assert cosine.min() >= 0.99, dict(zip(TEXTS, cosine.round(5)))
    # Both are unit vectors already (sentence-transformers' Normalize module, our normalize=True).
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1.0, rtol=1e-5)


def test_same_tokens_as_the_reference_tokenizer(model, reference):
    """llama.cpp's WPM tokenizer (lowercasing, accent stripping, CJK split) gives the Hugging Face tokenizer's ids."""
    for text, ids in zip(TEXTS + [QUERY] + DOCS, reference["tokens"]):
        assert model.model.tokenize(text, True, False) == ids, text


def test_retrieval_ranks_documents_as_the_reference_does(model, reference):
    ours = model.embed([QUERY] + DOCS)
    theirs = unit(reference["embeddings"][len(TEXTS):])
    our_scores, their_scores = ours[1:] @ ours[0], theirs[1:] @ theirs[0]
    assert list(np.argsort(-our_scores)) == list(np.argsort(-their_scores))
    assert list(np.argsort(-our_scores)) == [3, 1, 5, 0, 4, 2]  # password, login, sign-in first; football last
    np.testing.assert_allclose(our_scores, their_scores, atol=0.01)


def test_pooling_is_the_ggufs_mean(model, minilm_path, reference):
    import gguf

    reader = gguf.GGUFReader(str(minilm_path))
    assert reader.fields["general.architecture"].contents() == "bert"
    assert reader.fields["bert.pooling_type"].contents() == int(lp.PoolingType.MEAN)
    assert reference["pooling"]["pooling_mode_mean_tokens"] and not reference["pooling"]["pooling_mode_cls_token"]
    default = model.embed(TEXTS[:4])
    ctx = model._embed_contexts[lp.PoolingType.UNSPECIFIED]
    assert lp.PoolingType(int(lib.llama_pooling_type(ctx._ptr))) == lp.PoolingType.MEAN
    np.testing.assert_allclose(default, model.embed(TEXTS[:4], pooling="mean"), atol=1e-6)
    assert not np.allclose(default, model.embed(TEXTS[:4], pooling="cls"), atol=1e-2)


def test_same_vectors_as_native_llama_embedding(model, native_tools, minilm_path):
    done = subprocess.run([str(native_tools / "llama-embedding"), "-m", str(minilm_path), "-p", "\n".join(TEXTS),
                           "--embd-output-format", "json", "-t", str(THREADS), "-c", "512"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    reference = np.array([d["embedding"] for d in json.loads(done.stdout)["data"]], dtype=np.float64)
    ours = model.embed(TEXTS)
    assert ours.shape == reference.shape
    cosine = (unit(ours) * unit(reference)).sum(axis=1)
    assert cosine.min() >= 0.9999, dict(zip(TEXTS, cosine.round(6)))
    np.testing.assert_allclose(ours, reference, atol=1e-3)


def test_a_text_past_the_512_positions_is_refused_or_cut(model):
    long = "river " * 600
    with pytest.raises(lp.ContextOverflowError, match=r"texts\[1\]"):
        model.embed(["short", long])
    out = model.embed(["short", long], truncate=True)
    assert out.shape == (2, 384) and np.isfinite(out).all()
