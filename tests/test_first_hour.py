"""The first hour of a new user (issue 35): the calls they write, and what they get back.

Sampling keywords give the chain SamplerParams builds (token for token, same seed); the
messages of a misspelt or renamed setting; the warnings of a context that is not what was
asked; `Llama.load` keywords; `embed`'s default pooling; `.parsed` on completions; tools a
template does not render; the sampler plugins' options.
"""

from __future__ import annotations

import asyncio
import logging
import math

import pydantic
import pytest
from llamaplug_testing import THREADS

import llamaplug as lp

PROMPT = "Once upon a time, in a land far away,"
CHAT = [{"role": "user", "content": "Tell me a short story about a dog."}]
# The keywords a user of llama-cpp-python or openai writes, and the SamplerParams fields they are.
SPELLINGS = {"repeat_penalty": "penalty_repeat", "presence_penalty": "penalty_present",
             "frequency_penalty": "penalty_freq"}
CASES = [
    {"temperature": 0.7, "seed": 1},
    {"temperature": 1.1, "top_k": 20, "top_p": 0.9, "min_p": 0.02, "seed": 7, "repeat_penalty": 1.3,
     "presence_penalty": 0.4, "frequency_penalty": 0.3},
    {"temperature": 1.5, "typical_p": 0.8, "seed": 3, "min_keep": 2, "xtc_probability": 0.5, "xtc_threshold": 0.1},
    {"mirostat": 2, "mirostat_tau": 4.0, "seed": 11},
]


def as_params(keywords: dict) -> lp.SamplerParams:
    return lp.SamplerParams(**{SPELLINGS.get(k, k): v for k, v in keywords.items()})


@pytest.mark.parametrize("keywords", CASES, ids=lambda k: ",".join(k))
def test_sampling_keywords_give_the_samplerparams_chain_token_for_token(llama, keywords):
    got = llama.create_completion(PROMPT, max_tokens=24, **keywords)
    want = llama.create_completion(PROMPT, max_tokens=24, sampler=as_params(keywords))
    assert got.tokens == want.tokens
    chat = llama.create_chat_completion(CHAT, max_tokens=16, **keywords)
    chat_want = llama.create_chat_completion(CHAT, max_tokens=16, sampler=as_params(keywords))
    assert chat.choices[0].message.content == chat_want.choices[0].message.content


def test_the_seed_keyword_decides_the_sample(llama):
    runs = {seed: llama.create_completion(PROMPT, max_tokens=24, temperature=1.5, seed=seed).tokens
            for seed in (1, 2, 1)}
    assert len(runs) == 2 and runs[1] != runs[2]
    again = llama.create_completion(PROMPT, max_tokens=24, temperature=1.5, seed=1).tokens
    assert again == runs[1]


def test_logit_bias_keyword_bans_the_greedy_token(llama):
    greedy = llama.create_completion(PROMPT, max_tokens=1).tokens[0]
    out = llama.create_completion(PROMPT, max_tokens=1, temperature=0, logit_bias={greedy: -math.inf}).tokens[0]
    assert out != greedy


def test_plural_and_async_forms_take_the_keywords(llama):
    keywords = {"temperature": 0.9, "seed": 5, "top_k": 30}
    one = llama.create_completion(PROMPT, max_tokens=12, **keywords).tokens
    many = llama.create_completions([PROMPT, PROMPT], max_tokens=12, **keywords)
    assert [c.tokens for c in many] == [one, one]  # one chain each, the same seed
    chats = llama.create_chat_completions([CHAT], max_tokens=10, **keywords)
    alone = llama.create_chat_completion(CHAT, max_tokens=10, **keywords)
    assert chats[0].choices[0].message.content == alone.choices[0].message.content

    async def main():
        allama = lp.AsyncLlama(llama)
        done = await allama.create_completion(PROMPT, max_tokens=12, **keywords)
        reply = await allama.create_chat_completion(CHAT, max_tokens=10, **keywords)
        return done.tokens, reply.choices[0].message.content

    tokens, content = asyncio.run(main())
    assert tokens == one and content == alone.choices[0].message.content


def test_greedy_and_samplerparams_as_sampler_on_the_singular_call(llama):
    default = llama.create_completion(PROMPT, max_tokens=12).tokens
    assert llama.create_completion(PROMPT, max_tokens=12, sampler="greedy").tokens == default
    assert llama.create_completion(PROMPT, max_tokens=12, sampler=lp.SamplerParams(temperature=0)).tokens == default
    assert [c.tokens for c in llama.create_completions([PROMPT], max_tokens=12, sampler="greedy")] == [default]
    chat = llama.create_chat_completion(CHAT, max_tokens=8, sampler="greedy").choices[0].message.content
    assert chat == llama.create_chat_completion(CHAT, max_tokens=8).choices[0].message.content


@pytest.mark.parametrize(("call", "match"), [
    (lambda llama: llama.create_completion(PROMPT, sampler="random"), "sampler must be a LlamaSampler"),
    (lambda llama: llama.create_chat_completion(CHAT, sampler=0.7), "sampler must be a LlamaSampler"),
    (lambda llama: llama.create_completion(PROMPT, sampler="greedy", temperature=0.5), "not both"),
    (lambda llama: llama.create_completion(PROMPT, temprature=0.5), "did you mean 'temperature'"),
    (lambda llama: llama.create_chat_completion(CHAT, max_token=5), "did you mean 'max_tokens'"),
    (lambda llama: llama.create_completion(PROMPT, temperature="hot"), "temperature"),
    (lambda llama: llama.create_completion(PROMPT, top_p=2.0), "top_p"),
    (lambda llama: llama.create_completion(PROMPT, repeat_penalty=1.1, penalty_repeat=1.2), "same setting"),
], ids=["unknown-name", "a-float", "both", "misspelt", "misspelt-call-word", "bad-value", "out-of-range", "twice"])
def test_bad_sampling_arguments_raise_at_the_call(llama, call, match):
    before = llama.create_completion(PROMPT, max_tokens=4)
    with pytest.raises(lp.InvalidParameterError, match=match):
        call(llama)
    after = llama.create_completion(PROMPT, max_tokens=4)  # the engine is fine: the same greedy run as before
    assert (after.tokens, after.stop_reason) == (before.tokens, before.stop_reason) and len(after.tokens) == 4


def test_load_takes_keywords(smollm2_path):
    with lp.Llama.load(smollm2_path, n_ctx=1024, n_threads=THREADS) as llama:
        assert llama.context.n_ctx == 1024 and llama.params.n_threads == THREADS
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_threads=THREADS), n_ctx=512) as llama:
        assert llama.context.n_ctx == 512
    with pytest.raises(lp.InvalidParameterError, match="flash_attn_type"):
        lp.Llama.load(smollm2_path, flash_attn=True)


@pytest.mark.parametrize(("given", "hint"), [
    ({"flash_attn": True}, "did you mean flash_attn_type"),
    ({"verbose": True}, "did you mean log_level"),
    ({"chat_format": "chatml"}, "chat_template= to create_chat_completion"),
    ({"n_gpu_layer": 0}, "did you mean 'n_gpu_layers'"),
    ({"embedding": True}, "did you mean 'embeddings'"),
    ({"temperature": 0.7}, "sampling setting, not a load one"),
    ({"model": "x.gguf"}, "did you mean 'model_path'"),
])
def test_unknown_load_settings_say_what_they_became(smollm2_path, given, hint):
    with pytest.raises(lp.InvalidParameterError, match=hint) as err:
        lp.LlamaParams(smollm2_path, **given)
    assert err.value.field == next(iter(given))


def test_sampler_params_say_the_llama_cpp_python_spelling():
    with pytest.raises(lp.InvalidParameterError, match="did you mean 'penalty_repeat'"):
        lp.SamplerParams(repeat_penalty=1.1)


def test_context_size_warnings(smollm2_path, caplog):
    caplog.set_level(logging.WARNING, logger="llamaplug.context")
    with lp.Llama.load(smollm2_path, n_ctx=100, n_threads=THREADS) as llama:
        assert llama.context.n_ctx == 256
    assert any("n_ctx=100 became 256" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with lp.Llama.load(smollm2_path, n_ctx=512, n_threads=THREADS) as llama:
        n_train = llama.model.n_ctx_train
    assert not caplog.records  # a size llama.cpp keeps: no word
    with lp.Llama.load(smollm2_path, n_ctx=n_train + 1024, n_threads=THREADS):
        pass
    assert any(f"more than the {n_train}" in r.getMessage() for r in caplog.records)


def test_a_context_too_large_names_the_training_context(smollm2_path):
    with lp.Llama.load(smollm2_path, n_ctx=512, n_threads=THREADS) as llama:
        n_train = llama.model.n_ctx_train
        with pytest.raises(lp.ContextTooLargeError, match=f"trained on {n_train} positions"):
            lp.LlamaContext(llama.model, lp.ContextParams(n_ctx=2**31 - 1))


def test_embed_pools_as_the_server_by_default(llama):
    texts = ["a dog", "a cat"]
    got = llama.embed(texts)
    assert got.shape == (2, llama.model.n_embd)
    assert (got == llama.embed(texts, pooling="mean")).all()
    per_token = llama.embed(texts, pooling="none")
    assert per_token[0].shape[0] == len(llama.tokenize("a dog"))


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    legs: int


def test_create_completion_with_a_pydantic_model_gives_parsed(llama):
    out = llama.create_completion("A pet as JSON: ", max_tokens=60, response_format=Pet)
    assert isinstance(out.parsed, Pet) and out.parsed == Pet.model_validate_json(out.text)
    many = llama.create_completions(["A pet as JSON: "], max_tokens=60, response_format=Pet)
    assert many[0].parsed == out.parsed
    assert llama.create_completion(PROMPT, max_tokens=4).parsed is None


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}

def test_tools_a_template_does_not_render_are_refused_not_dropped(llama):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    assert "tools" not in (llama.model.chat_template or "")  # SmolLM2's template has no place for them
    # "f": a name that is in the prompt by chance (a walk-through found it let through when the check looked
    # for the tools' names in the prompt).
    short = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    for choice in (None, "auto", "required"):
        for tool in (WEATHER, short):
            with pytest.raises(lp.InvalidParameterError, match="no place for tools") as err:
                llama.create_chat_completion(ask, tools=[tool], tool_choice=choice, max_tokens=4)
            # each API's own spelling (llama_cpp.Llama's compat takes chat_format, not chat_template)
            assert err.value.field == "tools" and 'chat_format="chatml-tools"' in str(err.value)
    # A template that renders them, and tool_choice "none", go on.
    llama.create_chat_completion(ask, tools=[WEATHER], max_tokens=4, chat_template="chatml-tools")
    llama.create_chat_completion(ask, tools=[WEATHER], tool_choice="none", max_tokens=4)


def test_a_sampler_plugins_bad_option_names_the_sampler_and_its_options():
    with pytest.raises(lp.InvalidParameterError, match="sampler plugin 'ban'.*tokens") as err:
        lp.SamplerChain().add("ban", token=[1])
    assert err.value.field == "sampler.ban"


def test_no_progress_dots_and_no_doubled_lines_after_a_failed_load(smollm2_path, tmp_path, caplog):
    broken = tmp_path / "truncated.gguf"
    with smollm2_path.open("rb") as src:
        broken.write_bytes(src.read(smollm2_path.stat().st_size // 2))
    caplog.set_level(logging.ERROR, logger="llamaplug.native")
    with pytest.raises(lp.InvalidModelError):
        lp.Llama.load(broken, n_threads=THREADS)
    lines = [r.getMessage() for r in caplog.records if r.name == "llamaplug.native"]
    assert lines and len(lines) == len(set(lines)), lines  # each native error line once
    caplog.clear()
    with lp.Llama.load(smollm2_path, n_ctx=256, n_threads=THREADS):
        pass
    dots = [r.getMessage() for r in caplog.records if r.getMessage().strip(".") == ""]
    assert not dots
