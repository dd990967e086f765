"""llamaplug.compat.llama_cpp: llama-cpp-python's high-level API on llamaplug, checked against llamaplug's own API.

`install_as_llama_cpp()` makes `import llama_cpp` give the compat module; then LangChain's LlamaCpp,
ChatLlamaCpp and LlamaCppEmbeddings (langchain-community, which imports llama_cpp and knows nothing of
llamaplug) must give the same greedy text and vectors as llamaplug's own API, and `llama_cpp.Llama`'s
own surface (completion and chat dicts, streams, grammars, logits processors, stopping criteria,
save/load state, tokens) is compared result by result with the llamaplug `Llama` underneath.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from llamaplug_testing import THREADS
from llamaplug_testing.chat_replies import TIME_TOOL, few_shot

import llamaplug as lp
from llamaplug.compat import install_as_llama_cpp, uninstall_llama_cpp
from llamaplug.compat import llama_cpp as compat

PROMPT = "The three primary colours are"
MESSAGES = [{"role": "user", "content": "Name a fruit that is yellow."}]


@pytest.fixture(scope="module")
def llama_cpp():
    """`import llama_cpp`, after install_as_llama_cpp() (undone after the module)."""
    assert "llama_cpp" not in sys.modules or sys.modules["llama_cpp"] is compat, "a real llama_cpp is imported"
    install_as_llama_cpp()
    import llama_cpp

    yield llama_cpp
    uninstall_llama_cpp()


@pytest.fixture(scope="module")
def llm(llama_cpp, smollm2_path):
    with llama_cpp.Llama(model_path=str(smollm2_path), n_ctx=1024, n_threads=THREADS, verbose=False, seed=1234,
                         logits_all=False, f16_kv=True, n_parts=-1) as model:  # two legacy keys, accepted
        yield model


def greedy(llm, prompt=PROMPT, max_tokens=24, chain=None, **kw):
    """llamaplug's own completion of `prompt` on the compat Llama's engine (text parsed as llama-cpp-python does)."""
    return llm.llamaplug.create_completion(prompt, max_tokens, sampler=chain or lp.SamplerChain().greedy(),
                                           special=True, **kw)


def test_import_llama_cpp_gives_the_compat_module(llama_cpp):
    assert llama_cpp is compat
    from llama_cpp.llama import Llama
    from llama_cpp.llama_grammar import LlamaGrammar

    assert Llama is compat.Llama and LlamaGrammar is compat.LlamaGrammar
    with pytest.raises(ImportError):
        import llama_cpp.llama_cpp  # noqa: F401 - the ctypes layer is not provided
    assert llama_cpp.__version__.startswith("0.3.") and "+llamaplug" in llama_cpp.__version__


def test_model_surface(llm):
    model = llm.llamaplug.model
    assert llm.n_ctx() == 1024 and llm.n_vocab() == model.n_vocab and llm.n_embd() == model.n_embd
    assert llm.token_eos() == model.eos and llm.token_bos() == (model.bos if model.bos is not None else -1)
    assert llm.metadata["general.architecture"] == "llama"
    tokens = llm.tokenize(b"Hello world")
    assert tokens == llm.llamaplug.tokenize("Hello world")
    assert llm.detokenize(tokens) == b"Hello world"
    assert llm.detokenize(tokens[-1:], prev_tokens=tokens[:-1]) == b" world"
    assert len(llm.tokenize(b"<|im_start|>", add_bos=False, special=True)) == 1
    assert len(llm.tokenize(b"<|im_start|>", add_bos=False, special=False)) > 1


def test_completion_dict_is_llamaplugs_greedy_text(llm):
    out = llm(PROMPT, max_tokens=24, temperature=0)
    ref = greedy(llm)
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    assert out["model"] == llm.model_path
    choice = out["choices"][0]
    assert choice["text"] == ref.text and choice["index"] == 0 and choice["logprobs"] is None
    assert choice["finish_reason"] == ("length" if ref.stop_reason == lp.StopReason.MAX_TOKENS else "stop")
    assert out["usage"] == {"prompt_tokens": len(ref.prompt_tokens), "completion_tokens": len(ref.tokens),
                            "total_tokens": len(ref.prompt_tokens) + len(ref.tokens)}
    assert list(llm.input_ids) == ref.prompt_tokens + ref.tokens
    echoed = llm.create_completion(PROMPT, max_tokens=24, temperature=0, echo=True)
    assert echoed["choices"][0]["text"] == PROMPT + ref.text


def test_stream_of_dicts_joins_to_the_text(llm):
    ref = greedy(llm)
    chunks = list(llm.create_completion(PROMPT, max_tokens=24, temperature=0, stream=True))
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0] == {"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == ref.text
    assert len({c["id"] for c in chunks}) == 1


def test_stop_sequence(llm):
    ref = greedy(llm)
    stop = ref.text.split()[2]
    cut = ref.text[: ref.text.index(stop)]
    out = llm(PROMPT, max_tokens=24, temperature=0, stop=[stop])
    assert out["choices"][0]["text"] == cut and out["choices"][0]["finish_reason"] == "stop"
    streamed = list(llm(PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True))
    assert "".join(c["choices"][0]["text"] for c in streamed) == cut
    assert streamed[-1]["choices"][0]["finish_reason"] == "stop"


def test_logprobs(llm):
    ref = greedy(llm, max_tokens=8, logprobs=3)
    out = llm(PROMPT, max_tokens=8, temperature=0, logprobs=3)["choices"][0]["logprobs"]
    assert out["tokens"] == [t.text for t in ref.logprobs]
    assert out["token_logprobs"] == pytest.approx([t.logprob for t in ref.logprobs])
    assert out["text_offset"][0] == len(PROMPT) and "".join(out["tokens"]) == ref.text
    for top, entry in zip(out["top_logprobs"], ref.logprobs):
        assert entry.text in top and max(top.values()) == pytest.approx(entry.top[0][1])
    streamed = [c["choices"][0]["logprobs"] for c in llm(PROMPT, max_tokens=8, temperature=0, logprobs=3,
                                                          stream=True)]
    assert [t for part in streamed if part for t in part["token_logprobs"]] == out["token_logprobs"]


def test_chat_dicts_are_llamaplugs_chat(llm):
    ref = llm.llamaplug.create_chat_completion(MESSAGES, max_tokens=24, sampler=lp.SamplerChain().greedy())
    out = llm.create_chat_completion(MESSAGES, max_tokens=24, temperature=0)
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": ref.choices[0].message.content}
    assert choice["finish_reason"] == ref.choices[0].finish_reason and choice["logprobs"] is None
    assert out["usage"] == ref.usage.model_dump()
    chunks = list(llm.create_chat_completion(MESSAGES, max_tokens=24, temperature=0, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"][0]["finish_reason"] == ref.choices[0].finish_reason
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == ref.choices[0].message.content


def test_chat_openai_v1_types(llm):
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    out = llm.create_chat_completion_openai_v1(messages=MESSAGES, max_tokens=12, temperature=0)
    assert isinstance(out, ChatCompletion)
    chunks = list(llm.create_chat_completion_openai_v1(messages=MESSAGES, max_tokens=12, temperature=0, stream=True))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == out.choices[0].message.content


def test_chat_format_names_a_builtin_template(llm, smollm2_path):
    out = llm.create_chat_completion(MESSAGES, max_tokens=8, temperature=0)
    assert llm.chat_format == "chat_template.default"
    with compat.Llama(str(smollm2_path), n_ctx=256, n_threads=THREADS, verbose=False, chat_format="llama-2") as l2:
        other = l2.create_chat_completion(MESSAGES, max_tokens=8, temperature=0)
        ref = l2.llamaplug.create_chat_completion(MESSAGES, max_tokens=8, sampler=lp.SamplerChain().greedy(),
                                                  chat_template="llama2")
    assert other["choices"][0]["message"]["content"] == ref.choices[0].message.content
    assert other["usage"]["prompt_tokens"] != out["usage"]["prompt_tokens"]  # another template
    with pytest.raises(lp.InvalidParameterError, match="chat_format 'nope'"):
        compat.Llama(str(smollm2_path), verbose=False, chat_format="nope")  # refused before loading


WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"]}}


def test_forced_tool_call_and_legacy_functions(llama_cpp, smollm2_path):
    # SmolLM2's own template has no place for tools: llama-cpp-python's chatml-function-calling format (here
    # llamaplug's chatml-tools), and two calls shown first (the 135M model calls no tool by itself).
    ask = few_shot("hermes")
    tools = [TIME_TOOL]
    choice = {"type": "function", "function": {"name": "get_time"}}
    with llama_cpp.Llama(model_path=str(smollm2_path), n_ctx=2048, n_threads=THREADS, verbose=False, seed=1234,
                         chat_format="chatml-function-calling") as llm:
        ref = llm.llamaplug.create_chat_completion(ask, max_tokens=48, sampler=lp.SamplerChain().greedy(),
                                                   tools=tools, tool_choice=choice,
                                                   chat_template="chatml-tools").choices[0]
        assert ref.finish_reason == "tool_calls"
        want = [c.function.model_dump() for c in ref.message.tool_calls]
        for kw in ({"tools": tools, "tool_choice": choice},
                   {"functions": [TIME_TOOL["function"]], "function_call": {"name": "get_time"}}):
            out = llm.create_chat_completion(ask, max_tokens=48, temperature=0, **kw)["choices"][0]
            assert out["finish_reason"] == "tool_calls"
            assert [c["function"] for c in out["message"]["tool_calls"]] == want
            assert out["message"]["function_call"] == want[0] and json.loads(want[0]["arguments"])["zone"]


def test_grammar_from_string(llm):
    gbnf = 'root ::= ("red" | "green" | "blue") ", " ("red" | "green" | "blue")'
    out = llm(PROMPT, max_tokens=24, temperature=0, grammar=compat.LlamaGrammar.from_string(gbnf))
    ref = greedy(llm, chain=lp.SamplerChain().grammar(lp.Grammar.from_string(gbnf)).greedy())
    assert out["choices"][0]["text"] == ref.text and ref.text.count(", ") == 1
    with pytest.raises(lp.InvalidGrammarError) as bad:
        compat.LlamaGrammar.from_string('root ::= "a')
    assert isinstance(bad.value, ValueError)


def test_grammar_from_json_schema(llm):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    grammar = compat.LlamaGrammar.from_json_schema(json.dumps(schema))
    out = llm("A person as JSON:", max_tokens=64, temperature=0, grammar=grammar)["choices"][0]["text"]
    jsonschema.validate(json.loads(out), schema)
    ref = greedy(llm, "A person as JSON:", 64, lp.SamplerChain().grammar(lp.Grammar.from_json_schema(schema)).greedy())
    assert out == ref.text
    chat = llm.create_chat_completion(MESSAGES, max_tokens=64, temperature=0,
                                      response_format={"type": "json_object", "schema": schema})
    jsonschema.validate(json.loads(chat["choices"][0]["message"]["content"]), schema)


def test_logits_processor_that_bans_a_token(llm):
    first = greedy(llm).tokens[0]
    seen = []

    def ban(input_ids, scores):
        seen.append(len(input_ids))
        scores[first] = -np.inf
        return scores

    out = llm(PROMPT, max_tokens=12, temperature=0, logits_processor=compat.LogitsProcessorList([ban]))
    ref = greedy(llm, max_tokens=12, chain=lp.SamplerChain().logit_bias({first: float("-inf")}).greedy())
    assert out["choices"][0]["text"] == ref.text and first not in ref.tokens
    n_prompt = len(ref.prompt_tokens)
    assert seen == list(range(n_prompt, n_prompt + len(ref.tokens)))  # the prompt, then one more id per token


def test_a_logits_processor_that_replaces_the_scores(llm):
    first = greedy(llm).tokens[0]

    def replace(input_ids, scores):
        out = np.copy(scores)
        out[first] = -np.inf
        return out

    out = llm(PROMPT, max_tokens=6, temperature=0, logits_processor=compat.LogitsProcessorList([replace]))
    ref = greedy(llm, max_tokens=6, chain=lp.SamplerChain().logit_bias({first: float("-inf")}).greedy())
    assert out["choices"][0]["text"] == ref.text
    with pytest.raises(lp.InvalidParameterError, match="logits processor returned"):
        llm(PROMPT, max_tokens=2, logits_processor=compat.LogitsProcessorList([lambda ids, s: s[:10]]))


@pytest.mark.parametrize("stream", [False, True])
def test_stopping_criteria(llm, stream):
    ref = greedy(llm, max_tokens=5)
    asked = []

    def five(input_ids, logits):
        asked.append(len(input_ids))
        assert logits.shape == (llm.n_vocab(),)
        return len(input_ids) >= len(ref.prompt_tokens) + 5

    out = llm(PROMPT, max_tokens=24, temperature=0, stopping_criteria=compat.StoppingCriteriaList([five]),
              stream=stream)
    if stream:
        chunks = list(out)
        text, finish = "".join(c["choices"][0]["text"] for c in chunks), chunks[-1]["choices"][0]["finish_reason"]
    else:
        text, finish = out["choices"][0]["text"], out["choices"][0]["finish_reason"]
        assert out["usage"]["completion_tokens"] == 5
    assert text == ref.text and finish == "stop"
    assert asked[:6] == list(range(len(ref.prompt_tokens), len(ref.prompt_tokens) + 6))


def test_seeded_sampling_and_save_load_state(llm):
    from llamaplug.compat.settings import next_seed

    llm.set_seed(42)
    llm(PROMPT, max_tokens=4)  # some tokens in the cache first; its seed was drawn from 42
    state = llm.save_state()
    assert state.seed == next_seed(42) and state.n_tokens == len(state.input_ids) > 0
    first = llm(PROMPT, max_tokens=16, temperature=1.0)["choices"][0]["text"]
    second = llm(PROMPT, max_tokens=16, temperature=1.0)["choices"][0]["text"]
    llm.load_state(state)
    again = llm(PROMPT, max_tokens=16, temperature=1.0)["choices"][0]["text"]
    assert again == first
    # The same texts from llamaplug's own chain with the seeds drawn after the saved one.
    seed = next_seed(state.seed)
    chain = lp.SamplerChain(seed=seed).top_k(40).typical(1.0, 1).top_p(0.95, 1).min_p(0.05, 1).temp(1.0).dist()
    assert greedy(llm, max_tokens=16, chain=chain).text == first
    chain = lp.SamplerChain(seed=next_seed(seed)).top_k(40).typical(1.0, 1).top_p(0.95, 1).min_p(0.05, 1) \
        .temp(1.0).dist()
    assert greedy(llm, max_tokens=16, chain=chain).text == second
    explicit = [llm(PROMPT, max_tokens=16, temperature=1.0, seed=7)["choices"][0]["text"] for _ in range(2)]
    assert explicit[0] == explicit[1]


def test_embeddings_are_llamaplugs(llm):
    texts = ["The cat sits on the mat.", "Stock markets fell today."]
    out = llm.create_embedding(texts)
    assert out["object"] == "list" and [d["index"] for d in out["data"]] == [0, 1]
    ref = llm.llamaplug.embed(texts, normalize=False)
    for d, r in zip(out["data"], ref):
        np.testing.assert_allclose(np.asarray(d["embedding"]), r, rtol=1e-5, atol=1e-5)
    n = sum(len(llm.llamaplug.tokenize(t)) for t in texts)
    assert out["usage"] == {"prompt_tokens": n, "total_tokens": n}
    single = llm.embed(texts[0], normalize=True)
    np.testing.assert_allclose(np.asarray(single), llm.llamaplug.embed(texts[:1], normalize=True)[0], atol=1e-5)


def test_bad_input_is_a_llama_error(llm, smollm2_path):
    with pytest.raises(lp.InvalidParameterError, match="text is not UTF-8"):
        llm.tokenize(b"\xff\xfe")
    with pytest.raises(lp.InvalidParameterError, match="chat_handler"):
        compat.Llama(str(smollm2_path), chat_handler=object(), verbose=False)
    with pytest.raises(lp.InvalidParameterError, match="vocab_only"):
        compat.Llama(str(smollm2_path), vocab_only=True, verbose=False)
    with pytest.raises(lp.InvalidParameterError, match="n_ctx"):
        compat.Llama(str(smollm2_path), n_ctx="big", verbose=False)
    with pytest.raises(lp.ModelNotFoundError):
        compat.Llama("/nonexistent/model.gguf", verbose=False)
    with pytest.raises(lp.InvalidParameterError, match="load_state"):
        llm.load_state(b"not a state")
    with pytest.raises(lp.InvalidParameterError, match="mirostat_mode"):
        llm(PROMPT, max_tokens=2, mirostat_mode=3)
    with pytest.raises(lp.InvalidTokenError):
        llm([llm.n_vocab() + 5], max_tokens=2)
    assert llm(PROMPT, max_tokens=2, temperature=0)["usage"]["completion_tokens"] == 2  # still fine


def test_from_pretrained_reads_the_hub_cache(llama_cpp, smollm2_path, tmp_path, monkeypatch):
    constants = pytest.importorskip("huggingface_hub.constants", reason='the hub extra: pip install "llamaplug[hub]"')
    main = "a" * 40
    repo = tmp_path / "models--hand--smol-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(main)
    link = repo / "snapshots" / main / "smol-Q8_0.gguf"
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.abspath(smollm2_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with llama_cpp.Llama.from_pretrained("hand/smol-GGUF", "*Q8_0.gguf", cache_dir=tmp_path, n_ctx=512,
                                         verbose=False) as llm:
        assert llm.n_ctx() == 512 and llm.tokenize(b"Hello") == llm.llamaplug.tokenize("Hello")


# -- LangChain (langchain-community), which imports llama_cpp ----------------------------------------------------


@pytest.fixture(scope="module")
def langchain(llama_cpp):
    return pytest.importorskip("langchain_community", reason="langchain-community (requirements-reference.txt)")


def test_langchain_llamacpp_greedy_and_streamed(langchain, smollm2_path):
    from langchain_community.llms import LlamaCpp

    for streaming in (False, True):
        llm = LlamaCpp(model_path=str(smollm2_path), temperature=0, max_tokens=24, n_threads=THREADS, verbose=False,
                       streaming=streaming)
        # LangChain's defaults: repeat_penalty 1.1 over the last 64 tokens, n_batch 8, n_ctx 512.
        chain = lp.SamplerChain().penalties(64, 1.1, 0.0, 0.0).greedy()
        ref = llm.client.llamaplug.create_completion(PROMPT, 24, sampler=chain, special=True)
        assert llm.client.llamaplug.params.n_batch == 8
        assert llm.invoke(PROMPT) == ref.text
        pieces = list(llm.stream(PROMPT))
        assert len(pieces) > 3 and "".join(pieces) == ref.text
        llm.client.close()


def test_langchain_chat_llamacpp(langchain, smollm2_path):
    from langchain_community.chat_models import ChatLlamaCpp
    from langchain_core.messages import HumanMessage

    chat = ChatLlamaCpp(model_path=str(smollm2_path), temperature=0, max_tokens=24, n_threads=THREADS, verbose=False)
    chain = lp.SamplerChain().penalties(64, 1.1, 0.0, 0.0).greedy()
    ref = chat.client.llamaplug.create_chat_completion(MESSAGES, max_tokens=24, sampler=chain)
    reply = chat.invoke([HumanMessage(content=MESSAGES[0]["content"])])
    assert reply.content == ref.choices[0].message.content
    streamed = "".join(c.content for c in chat.stream([HumanMessage(content=MESSAGES[0]["content"])]))
    assert streamed == ref.choices[0].message.content
    chat.client.close()


def test_langchain_llamacpp_embeddings(langchain, smollm2_path):
    from langchain_community.embeddings import LlamaCppEmbeddings

    emb = LlamaCppEmbeddings(model_path=str(smollm2_path), n_threads=THREADS, verbose=False)
    texts = ["The cat sits on the mat.", "Stock markets fell today."]
    ref = emb.client.llamaplug.embed(texts, normalize=False)
    rows = [row for r in ref for row in np.atleast_2d(r)]  # one vector per text, or per token when not pooled
    got = emb.embed_documents(texts)
    assert len(got) == len(rows)
    np.testing.assert_allclose(np.asarray(got), np.asarray(rows), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(emb.embed_query(texts[0])), np.atleast_2d(ref[0])[0], rtol=1e-5,
                               atol=1e-5)
    emb.client.close()
