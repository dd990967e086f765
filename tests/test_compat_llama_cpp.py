"""llamaplug.compat.llama_cpp: llama-cpp-python's high-level API on llamaplug, checked against llama-cpp-python 0.3.36.

Each check of tests/fixtures/llama_cpp_checks.py (the Llama's surface, completion and chat dicts, streams, stops,
logprobs, chat formats, forced tool calls, grammars, logits processors, stopping criteria, seeds and saved
state, embeddings, bad input, and LangChain's LlamaCpp, ChatLlamaCpp and LlamaCppEmbeddings, which import
llama_cpp themselves) runs with the same arguments, each API's own defaults otherwise, on llama-cpp-python
itself and on llamaplug.compat after install_as_llama_cpp(), one child process a side, both at once
(llamaplug_testing/llama_cpp_reference.py: the wiring of test_compat_frameworks.py). Each result must be the
reference's; where llamaplug.compat differs on purpose, the test asserts the difference and says why. What only
llamaplug has (the module standing in for llama_cpp, the hub cache) is checked here in-process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from llamaplug_testing.llama_cpp_reference import REFERENCE, run_both

from llamaplug.compat import install_as_llama_cpp, uninstall_llama_cpp
from llamaplug.compat import llama_cpp as compat

# Two children, each loading SmolLM2 about ten times (the checks' own Llamas, LangChain's) and generating a few
# hundred tokens: over 30 s on the CI's two cores.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "fixtures" / "llama_cpp_checks.py"
PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def sides(native_tools, smollm2_path) -> dict[str, dict]:
    """Each side's result of every check (one model load a side for most; a few checks make their own Llama)."""
    out = {}
    for side, stdout in run_both(SCRIPT, smollm2_path, native_tools).items():
        out[side] = {k: v for line in stdout.splitlines() for k, v in json.loads(line).items()}
    assert out["reference"]["llama_cpp"] == REFERENCE and "+llamaplug" in out["compat"]["llama_cpp"]
    return out


def both(sides, name):
    ref, ours = sides["reference"][name], sides["compat"][name]
    for side, got in (("reference", ref), ("compat", ours)):
        assert "trace" not in got, f"{name} on {side}: {got['trace']}"
    return ref, ours


def catches(ours: dict, ref: dict) -> bool:
    """Whether code written for the reference's exception catches ours: ours is a LlamaError and of its type."""
    return "LlamaError" in ours["bases"] and ref["error"] in ours["bases"]


def test_import_llama_cpp_gives_the_compat_module():
    assert "llama_cpp" not in sys.modules or sys.modules["llama_cpp"] is compat, "a real llama_cpp is imported"
    install_as_llama_cpp()
    try:
        import llama_cpp
        from llama_cpp.llama import Llama
        from llama_cpp.llama_grammar import LlamaGrammar

        assert llama_cpp is compat and Llama is compat.Llama and LlamaGrammar is compat.LlamaGrammar
        with pytest.raises(ImportError):
            import llama_cpp.llama_cpp  # noqa: F401 - the ctypes layer is not provided
        assert llama_cpp.__version__.startswith("0.3.") and "+llamaplug" in llama_cpp.__version__
    finally:
        uninstall_llama_cpp()


def test_model_surface(sides):
    # sizes, special tokens, metadata, tokenize/detokenize, chat_format and llama-cpp-python's defaults
    # (n_batch 512, n_threads half the logical CPUs)
    ref, ours = both(sides, "surface")
    assert ours == ref


def test_completion_dict(sides):
    ref, ours = both(sides, "completion")
    assert ref["text"] and ref["finish_reason"] == "length"
    # input_ids: llama-cpp-python's is its whole n_ctx buffer, valid to n_tokens, and n_tokens stops before the
    # last sampled token (it never evaluates it); here the ids of the last prompt and reply, all of them. The
    # tokens both have are the same.
    n = ref["n_tokens"]
    assert len(ref["input_ids"]) == 1024 and ours["n_tokens"] == len(ours["input_ids"]) == n + 1
    assert ours["input_ids"][:n] == ref["input_ids"][:n] == ours["input_ids"][:-1]
    same = {k: v for k, v in ref.items() if k not in ("n_tokens", "input_ids")}
    assert {k: v for k, v in ours.items() if k not in ("n_tokens", "input_ids")} == same


def test_stream_of_dicts(sides):
    ref, ours = both(sides, "stream")
    assert ref["text"] == sides["reference"]["completion"]["text"] and ref["finish"][-1] == "length"
    assert ours == ref


def test_stop_sequence(sides):
    ref, ours = both(sides, "stop")
    assert ref["finish"] == "stop" and ref["word"] not in ref["text"]
    assert ours == ref


def test_logprobs(sides):
    ref, ours = both(sides, "logprobs")
    # llama-cpp-python computes them only with logits_all=True; llamaplug needs no full logits buffer for them
    assert ref["without_logits_all"]["error"] == "ValueError" and "logits_all" in ref["without_logits_all"]["message"]
    assert ours["without_logits_all"]["choices"][0]["logprobs"]["tokens"] == ref["tokens"][:2]
    assert ours["text"] == ref["text"] and ours["tokens"] == ref["tokens"] and ours["text_offset"] == ref["text_offset"]
    # the same logits, softmaxed in float64 here and float32 there
    for got, want in ((ours["token_logprobs"], ref["token_logprobs"]), (ours["streamed"], ref["streamed"])):
        assert got == pytest.approx(want, abs=1e-5)
    for got, want in zip(ours["top_logprobs"], ref["top_logprobs"]):
        assert list(got) == list(want) and list(got.values()) == pytest.approx(list(want.values()), abs=1e-5)


def test_chat_dicts(sides):
    ref, ours = both(sides, "chat")
    assert ref["choice"]["message"]["content"] and ref["streamed"] == ref["choice"]["message"]["content"]
    assert ours == ref


def test_chat_openai_v1_types(sides):
    ref, ours = both(sides, "chat_openai_v1")
    assert ref["type"] == "ChatCompletion" and ref["chunk_types"] == ["ChatCompletionChunk"]
    assert ours == ref


def test_chat_format_llama2(sides):
    ref, ours = both(sides, "chat_format_llama2")
    # chat_format="llama-2" is llama-cpp-python's own Python formatter there (" <s>[INST]question  [/INST]": a
    # leading space, "<s>" as text, none after [INST], two before [/INST]) and llama.cpp's llama2 template here (the
    # format's published layout, "[INST] question [/INST]"): each prompt is its renderer's, so the replies differ
    assert ref["formats"] == ours["formats"]  # the same tokenizer
    assert ref["prompt_tokens"] == ref["formats"]["python"] and ours["prompt_tokens"] == ours["formats"]["llama.cpp"]


def test_forced_tool_call_and_legacy_functions(sides):
    # chatml-function-calling, with tools and tool_choice and with the legacy functions and function_call
    ref, ours = both(sides, "forced_tool_call")
    for way in ("tools", "functions"):
        want, got = ref[way], ours[way]
        assert want["finish_reason"] == got["finish_reason"] == "tool_calls"
        # the same call with the same arguments; their JSON text is each grammar's (llama-cpp-python's own JSON
        # grammar lets SmolLM2 write '{ "zone" : ... }', llama.cpp's json-schema grammar here no such spaces)
        for calls in ((want["calls"], got["calls"]), ([want["function_call"]], [got["function_call"]])):
            assert [(c["name"], json.loads(c["arguments"])) for c in calls[1]] == [
                (c["name"], json.loads(c["arguments"])) for c in calls[0]]
        assert json.loads(want["calls"][0]["arguments"]) == {"zone": "Europe/Berlin"}


def test_grammar_from_string(sides):
    ref, ours = both(sides, "grammar_from_string")
    assert ours["text"] == ref["text"] and ref["text"].count(", ") == 1
    # a bad grammar: llama-cpp-python makes the object and fails only when sampling with it; here it is refused
    # when made (an InvalidGrammarError, a ValueError), naming where it is wrong
    assert ref["bad"] == "LlamaGrammar" and ours["bad"]["error"] == "InvalidGrammarError"
    assert "ValueError" in ours["bad"]["bases"]


def test_grammar_from_json_schema(sides):
    # LlamaGrammar.from_json_schema and a chat's response_format json_object with a schema: the same values; the
    # whitespace between them is each converter's (llama-cpp-python's Python json-schema-to-GBNF there, the pin's
    # json-schema-to-grammar here, which llama-server uses too), and SmolLM2 writes what each allows
    ref, ours = both(sides, "grammar_from_json_schema")
    for key in ("text", "chat"):
        assert json.loads(ours[key]) == json.loads(ref[key])
        assert ours[key] != ref[key]


def test_logits_processors(sides):
    # a processor that bans the greedy first token in place, one that returns new scores: the same texts, and
    # the same calls (the prompt's ids, then one more a token)
    ref, ours = both(sides, "logits_processor")
    n = ref["prompt_tokens"]
    assert ref["seen"] == list(range(n, n + 12))
    assert {k: v for k, v in ours.items() if k != "short"} == {k: v for k, v in ref.items() if k != "short"}
    # one that returns 10 scores for a 49152-token vocabulary: llama-cpp-python prints the exception and samples on
    # as if there were no processor; here it is an error naming what came back (nothing a user gave is ignored)
    assert ref["short"] == sides["reference"]["completion"]["text"][:len(ref["short"])]
    assert ours["short"]["error"] == "InvalidParameterError" and "(10,)" in ours["short"]["message"]


def test_stopping_criteria(sides):
    # asked before each token with the ids so far and that token's logits; stopping at 5 tokens, whole and streamed
    ref, ours = both(sides, "stopping_criteria")
    assert ref["whole"]["completion_tokens"] == 5 and ref["whole"]["shapes"] == [[ref["n_vocab"]]]
    assert ours == ref


def test_seeded_sampling_and_save_load_state(sides):
    ref, ours = both(sides, "seeded_sampling_and_state")
    for side in (ref, ours):  # a saved state repeats its texts; an explicit seed repeats its text
        assert side["again"] == side["first"] != side["second"] and side["explicit"][0] == side["explicit"][1]
    # the same texts at temperature 1 from the same seeds (llama-cpp-python's seed chain and sampler order); the
    # state's n_tokens differs as input_ids do (test_completion_dict): here the last sampled token is counted
    assert ours["n_tokens"] == ours["input_ids"] == ref["n_tokens"] + 1 and ref["input_ids"] == 1024
    assert {k: v for k, v in ours.items() if k not in ("n_tokens", "input_ids")} == {
        k: v for k, v in ref.items() if k not in ("n_tokens", "input_ids")}


def test_embeddings(sides):
    ref, ours = both(sides, "embeddings")
    # llama-cpp-python embeds only on a Llama made with embedding=True; llamaplug has embedding contexts of its
    # own, so any Llama embeds (docs/from-llama-cpp-python.md)
    assert ref["without_embedding"]["error"] == "RuntimeError" and ours["without_embedding"] == 2
    # SmolLM2 names no pooling: the model's own is none (pooling_type 0), a vector per token, on both
    assert ref["pooling_type"] == ours["pooling_type"] == 0
    same = ("object", "index", "usage")
    assert {k: ours[k] for k in same} == {k: ref[k] for k in same}
    assert [np.shape(v) for v in ours["vectors"]] == [np.shape(v) for v in ref["vectors"]] == [(7, 576), (5, 576)]
    close = {"rtol": 1e-3, "atol": 1e-3}
    np.testing.assert_allclose(np.asarray(ours["vectors"][0]), np.asarray(ref["vectors"][0]), **close)
    np.testing.assert_allclose(np.asarray(ours["normalized"]), np.asarray(ref["normalized"]), **close)
    # A later text of the same batch: llama-cpp-python 0.3.36 reads its per-token vectors at the wrong place (an
    # offset in tokens used as one in floats: the second text's rows start 7 floats in, 7 the first text's tokens),
    # so they are not that text's vectors, which it gives for the text alone; here they are. Not copied.
    np.testing.assert_allclose(np.asarray(ours["vectors"][1]), np.asarray(ref["second_alone"]), **close)
    np.testing.assert_allclose(np.asarray(ours["second_alone"]), np.asarray(ref["second_alone"]), **close)
    assert not np.allclose(np.asarray(ref["vectors"][1]), np.asarray(ref["second_alone"]), **close)


def test_bad_input(sides):
    ref, ours = both(sides, "bad_input")
    assert ours["still_fine"] == ref["still_fine"] == 2  # the Llama still answers
    # Where llama-cpp-python raises, llamaplug raises a LlamaError that code catching its type catches too, naming
    # the argument (ValueError for a missing file: FileNotFoundError here, an OSError; TypeError for n_ctx="big",
    # AttributeError for load_state(bytes), RuntimeError from llama_decode for a token outside the vocabulary and
    # LlamaChatCompletionHandlerNotFoundException for chat_format="nope" are not copied: each is an
    # InvalidParameterError / InvalidTokenError here, ValueErrors, raised before anything runs)
    assert {k for k, v in ref.items() if isinstance(v, dict)} == {"n_ctx", "no_file", "chat_format", "load_state",
                                                                   "bad_token"}
    assert ours["no_file"]["error"] == "ModelNotFoundError" and "FileNotFoundError" in ours["no_file"]["bases"]
    for case, name in (("n_ctx", "n_ctx"), ("chat_format", "chat_format 'nope'"), ("load_state", "load_state"),
                       ("bad_token", "49157")):
        assert "LlamaError" in ours[case]["bases"] and "ValueError" in ours[case]["bases"]
        assert name in ours[case]["message"]
    # What llama-cpp-python takes silently, refused here (nothing a user gave is silently changed or ignored):
    # bytes that are not UTF-8 (it tokenizes them as replacement characters), mirostat_mode=3 (it samples as
    # with 0), a chat_handler object it would call (llamaplug runs llama.cpp's templates, not Python handlers)
    # and vocab_only=True (a compat Llama always has a context)
    assert ref["not_utf8"] and ref["mirostat_mode"] == 2 and ref["chat_handler"] is not None
    assert ref["vocab_only"] == 49152
    for case in ("not_utf8", "mirostat_mode", "chat_handler", "vocab_only"):
        assert ours[case]["error"] == "InvalidParameterError", case


def test_langchain_llamacpp(sides):
    # LangChain's defaults on both (repeat_penalty 1.1 over 64 tokens, n_batch 8, n_ctx 512), whole and streamed
    ref, ours = both(sides, "langchain_llamacpp")
    assert ref["whole"]["invoke"] == "".join(ref["whole"]["stream"]) and ref["whole"]["n_batch"] == 8
    assert ours == ref


def test_langchain_chat_llamacpp(sides):
    ref, ours = both(sides, "langchain_chat_llamacpp")
    assert ref["invoke"] and ref["stream"] == ref["invoke"]
    assert ours == ref


def test_langchain_llamacpp_embeddings(sides):
    # LlamaCppEmbeddings flattens per-token vectors into rows: a row a token of each text (7 + 5) on both; the
    # first text's rows and the query's vector are the reference's, the second text's are its vectors alone (as
    # in test_embeddings, llama-cpp-python reads a later text's at the wrong place)
    ref, ours = both(sides, "langchain_embeddings")
    close = {"rtol": 1e-3, "atol": 1e-3}
    assert np.shape(ours["documents"]) == np.shape(ref["documents"]) == (12, 576)
    np.testing.assert_allclose(np.asarray(ours["documents"][:7]), np.asarray(ref["documents"][:7]), **close)
    np.testing.assert_allclose(np.asarray(ours["query"]), np.asarray(ref["query"]), **close)
    alone = np.asarray(sides["reference"]["embeddings"]["second_alone"])
    np.testing.assert_allclose(np.asarray(ours["documents"][7:]), alone, **close)
    assert not np.allclose(np.asarray(ref["documents"][7:]), alone, **close)


def test_from_pretrained_reads_the_hub_cache(smollm2_path, tmp_path, monkeypatch):
    # llamaplug's own hub loader (llama-cpp-python's downloads through huggingface_hub itself): here offline,
    # from a hand-made hub cache
    constants = pytest.importorskip("huggingface_hub.constants", reason='the hub extra: pip install "llamaplug[hub]"')
    main = "a" * 40
    repo = tmp_path / "models--hand--smol-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(main)
    link = repo / "snapshots" / main / "smol-Q8_0.gguf"
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.abspath(smollm2_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with compat.Llama.from_pretrained("hand/smol-GGUF", "*Q8_0.gguf", cache_dir=tmp_path, n_ctx=512,
                                      verbose=False) as llm:
        assert llm.n_ctx() == 512 and llm.tokenize(b"Hello") == llm.llamaplug.tokenize("Hello")
