"""Rerank on a tiny generated rank-pooling model: the scores of the pin's llama-server /v1/rerank."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.tiny_gguf import write_tiny_reranker
from llamaplug_testing import llama_server, post_json

import llamaplug as lp

QUERY = "the world"
DOCS = ["hello world", "the cat is here", "it is all the world there is", "a", "hello hello hello"]


@pytest.fixture(scope="module")
def reranker_path(tmp_path_factory):
    return write_tiny_reranker(tmp_path_factory.mktemp("rerank") / "tiny-reranker.gguf")


@pytest.fixture(scope="module")
def reranker(reranker_path):
    with lp.Llama.load(lp.LlamaParams(reranker_path, n_ctx=128, n_threads=1)) as llama:
        yield llama


def test_scores_equal_llama_servers(native_tools, reranker, reranker_path):
    ours = reranker.rerank(QUERY, DOCS)
    assert ours.shape == (len(DOCS),) and np.isfinite(ours).all() and len(set(ours.tolist())) > 1
    with llama_server(native_tools, reranker_path, "-c", "128", "--reranking") as port:
        theirs = post_json(port, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": len(DOCS)})
    by_index = {r["index"]: r["relevance_score"] for r in theirs["results"]}
    reference = np.array([by_index[i] for i in range(len(DOCS))])
    # The server scores one document per decode, we score them together: other kernels, the last digits differ.
    np.testing.assert_allclose(ours, reference, atol=1e-3)
    assert list(np.argsort(-ours)) == list(np.argsort(-reference))


def test_one_document_at_a_time_gives_the_same_scores(reranker):
    together = reranker.rerank(QUERY, DOCS)
    alone = np.array([reranker.rerank(QUERY, [d])[0] for d in DOCS])
    np.testing.assert_allclose(together, alone, atol=1e-3)


def test_rerank_needs_a_reranker_and_embed_refuses_one(llama, reranker):
    with pytest.raises(lp.InvalidParameterError, match="not a reranker"):
        llama.rerank("q", ["d"])
    with pytest.raises(lp.InvalidParameterError, match="use rerank"):
        reranker.embed(["x"])


@pytest.mark.parametrize("query,docs,field", [(1, ["d"], "query"), ("q", "d", "documents"), ("q", [], "documents"),
                                              ("q", ["ok", None], "documents[1]")])
def test_bad_rerank_input(reranker, query, docs, field):
    with pytest.raises(lp.InvalidParameterError) as err:
        reranker.rerank(query, docs)
    assert err.value.field == field
