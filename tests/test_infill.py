"""Fill-in-the-middle: the prompt from the model's FIM tokens, and the error for models without them."""

from __future__ import annotations

import pytest
from fixtures.tiny_gguf import FIM, write_tiny_model

import llamaplug as lp


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("fim") / "tiny-fim.gguf", FIM)
    with lp.Llama.load(lp.LlamaParams(path, n_ctx=128, n_threads=1)) as llama:
        yield llama


def test_a_model_without_fim_tokens_names_them(llama):
    with pytest.raises(lp.InvalidModelError, match="FIM prefix, FIM suffix, FIM middle"):
        llama.create_infill("def f(x):\n    return ", "\n")


def test_prefix_suffix_middle_layout(fim_model):
    from llamaplug.high.infill import infill_tokens

    m = fim_model.model
    pre, suf, mid = (value for _, value in FIM)
    prefix, suffix = m.tokenize("hello", False), m.tokenize(" world", False)
    assert infill_tokens(m, "hello", " world") == [m.bos, pre, *prefix, suf, *suffix, mid]
    assert infill_tokens(m, "hello", " world", spm=True) == [m.bos, suf, *suffix, pre, *prefix, mid]


def test_coder_vocab_with_repository_tokens(llama_cpp_dir):
    """refact's vocabulary has FIM_REP too: the repository header comes first, as in llama.cpp's server."""
    from llamaplug.high.infill import infill_tokens

    model = lp.LlamaModel.load(llama_cpp_dir / "models" / "ggml-vocab-refact.gguf", lp.ModelParams(vocab_only=True))
    try:
        tokens = infill_tokens(model, "a = ", "\nb = 2", extra=[{"filename": "x.py", "text": "c = 3"}])
        rep = 18
        assert tokens[0] == rep and model.detokenize(tokens[1:], special=True).startswith("myproject\n")
        assert tokens[-1] == 2  # FIM middle last
    finally:
        model.close()


def test_infill_generates(fim_model):
    out = fim_model.create_infill("hello", " world", max_tokens=8, sampler=lp.SamplerChain().greedy())
    assert 0 < len(out.tokens) <= 8 or out.stop_reason == lp.StopReason.EOS
    with pytest.raises(lp.InvalidParameterError, match="prefix"):
        fim_model.create_infill(None, "x")


def test_infill_equals_llama_servers(native_tools, fim_model, tmp_path):
    """The pin's llama-server /infill on the same (tiny, FIM-token) model: the same greedy tokens."""
    from llamaplug_testing import llama_server, post_json

    path = write_tiny_model(tmp_path / "tiny-fim.gguf", FIM)
    with llama_server(native_tools, path, "-c", "128") as port:
        for prefix, suffix in [("hello", " world"), ("the cat", ""), ("", " is it")]:
            theirs = post_json(port, "/infill", {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 8,
                                                 "temperature": 0, "cache_prompt": False, "return_tokens": True})
            ours = fim_model.create_infill(prefix, suffix, max_tokens=8, sampler=lp.SamplerChain().greedy())
            tokens = theirs["tokens"]
            if tokens and fim_model.model.token_is_eog(tokens[-1]):  # the server lists the end token, we stop at it
                tokens = tokens[:-1]
                assert ours.stop_reason == lp.StopReason.EOS
            assert ours.tokens == tokens, (prefix, suffix, theirs.get("content"))
