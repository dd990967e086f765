"""`--pooling none` as the pin's test_embedding.py asks it of llama-server (issue 48 part 6), on all-MiniLM-L6-v2
(tests/fixtures/minilm.py): /embeddings gives one row per token, not normalized, and /v1/embeddings refuses it
with a 400. The same script against the pin's llama-server and `llamaplug serve`, compared.
"""

from __future__ import annotations

import numpy as np
import pytest
from fixtures import minilm
from llamaplug_testing import on_both, post_status


@pytest.fixture(scope="module")
def minilm_path(llama_cpp_dir):
    return minilm.gguf_path(llama_cpp_dir)


def _script(port: int) -> dict:
    native = post_status(port, "/embeddings", {"input": "hello hello hello"})
    oai = post_status(port, "/v1/embeddings", {"input": "hello hello hello"})
    return {"native": native[0], "rows": np.array(native[1][0]["embedding"]) if native[0] == 200 else None,
            "oai": oai[0], "oai_error": "error" in oai[1]}


def test_pooling_none_is_per_token_and_refused_by_v1(native_tools, minilm_path):
    both = on_both(native_tools, minilm_path, _script, "-c", "512", "--embedding", "--pooling", "none")
    theirs, ours = both["theirs"], both["ours"]
    assert theirs["native"] == 200 and theirs["oai"] == 400 and theirs["oai_error"]
    assert (ours["native"], ours["oai"], ours["oai_error"]) == (theirs["native"], theirs["oai"], theirs["oai_error"])
    assert ours["rows"].shape == theirs["rows"].shape  # [CLS] hello hello hello [SEP]
    assert np.abs(ours["rows"] - theirs["rows"]).max() < 1e-2  # the model's own rows, not normalized (as theirs)


# The input shapes of the pin's test_embedding_mixed_input and test_embedding_invalid_input.
INPUTS = ["", "string", [12, 34, 56], [12, 34, "string", 56, 78], ["string1", "string2"], ["string1", [12, 34, 56]],
          [[12, 34, 56], [12, 34, 56]], [[12, 34, 56], [12, "string", 34, 56]], {"prompt_string": "string"},
          {"content": [{"type": "text", "text": "string"}]},
          ["string1", {"prompt_string": "string2"}, {"content": [{"type": "text", "text": "string3"}]}],
          [], {"content": "string"}, {"content": [{"type": "unknown"}]},
          {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]


def _inputs(port: int) -> list:
    out = []
    for given in INPUTS:
        status, body = post_status(port, "/v1/embeddings", {"input": given})
        out.append((status, [np.array(d["embedding"]) for d in body["data"]] if status == 200 else None,
                    body["usage"]["prompt_tokens"] if status == 200 else None))
    same = post_status(port, "/v1/embeddings", {"input": [
        "hello world", {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}]})
    return [out, same[0], same[1]["data"][0]["embedding"] == same[1]["data"][1]["embedding"] if same[0] == 200
            else None]


def test_input_shapes_as_llama_server(native_tools, minilm_path):
    both = on_both(native_tools, minilm_path, _inputs, "-c", "512", "--embedding", "--pooling", "mean")
    (theirs, their_status, their_same), (ours, our_status, our_same) = both["theirs"], both["ours"]
    assert (our_status, our_same) == (their_status, their_same) == (200, True)
    for given, (status, vectors, used), (t_status, t_vectors, t_used) in zip(INPUTS, ours, theirs):
        assert (status == 200, used) == (t_status == 200, t_used), given
        if vectors is not None:
            assert len(vectors) == len(t_vectors), given
            for v, t in zip(vectors, t_vectors):
                assert np.abs(v - t).max() < 1e-2, given
