"""create_completion: streaming, stop sequences, stop reasons, logprobs, timings."""

from __future__ import annotations

import math

import numpy as np

import llamaplug as lp

PROMPT = "The capital of France is"


def test_stream_joins_to_text(llama):
    whole = llama.create_completion(PROMPT, max_tokens=32)
    chunks = list(llama.create_completion(PROMPT, max_tokens=32, stream=True))
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks for t in c.tokens] == whole.tokens
    assert chunks[-1].stop_reason == whole.stop_reason == lp.StopReason.MAX_TOKENS
    assert all(c.stop_reason is None for c in chunks[:-1])


def test_stop_sequence_cuts_exactly(llama):
    whole = llama.create_completion(PROMPT, max_tokens=32).text
    # A stop string that straddles token boundaries: a piece of the text from inside two tokens.
    start = whole.index("United") + 2
    stop = whole[start:start + 7]
    out = llama.create_completion(PROMPT, max_tokens=32, stop=[stop, "never-appears"])
    assert out.stop_reason == lp.StopReason.STOP_SEQUENCE
    assert out.text == whole[: whole.index(stop)]
    streamed = list(llama.create_completion(PROMPT, max_tokens=32, stop=stop, stream=True))
    assert "".join(c.text for c in streamed) == out.text
    assert stop not in "".join(c.text for c in streamed)


def test_max_tokens_counts(llama):
    out = llama.create_completion(PROMPT, max_tokens=5)
    assert len(out.tokens) == 5 and out.stop_reason == lp.StopReason.MAX_TOKENS
    assert llama.create_completion(PROMPT, max_tokens=0).tokens == []


def test_eos_stops(llama):
    # The instruct model ends its answer with <|im_end|> (an end-of-generation token).
    prompt = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    out = llama.create_completion(prompt, max_tokens=200, special=True)
    assert out.stop_reason == lp.StopReason.EOS
    assert len(out.tokens) < 200
    assert all(not llama.model.token_is_eog(t) for t in out.tokens)


def test_logprobs_match_logits(llama):
    out = llama.create_completion(PROMPT, max_tokens=3, logprobs=5)
    assert out.logprobs is not None and len(out.logprobs) == 3
    first = out.logprobs[0]
    assert first.token == out.tokens[0]
    assert len(first.top) == 5 and first.top[0][0] == first.token  # greedy picks the most likely
    assert all(a[1] >= b[1] for a, b in zip(first.top, first.top[1:]))
    assert math.isclose(first.logprob, first.top[0][1])
    assert sum(math.exp(lp_) for _, lp_ in first.top) <= 1.0 + 1e-6


def test_prompt_as_tokens(llama):
    tokens = llama.tokenize(PROMPT)
    assert llama.create_completion(tokens, max_tokens=8).tokens == llama.create_completion(PROMPT, max_tokens=8).tokens


def test_utf8_split_across_tokens(llama):
    # Emoji and CJK need several byte-level tokens each; the text must come out whole.
    text = "🦙🦙 東京"
    tokens = llama.tokenize(text, add_bos=False)
    pieces = [llama.model.token_to_piece(t) for t in tokens]
    assert any(p.decode("utf-8", "replace") != p.decode("utf-8", "ignore") for p in pieces), \
        "test needs a character split across tokens"
    assert b"".join(pieces).decode() == text
    assert llama.detokenize(tokens) == text


def test_timings(llama):
    out = llama.create_completion(PROMPT, max_tokens=8)
    t = out.timings
    assert t.prompt_tokens == len(llama.tokenize(PROMPT)) and t.predicted_tokens == 8
    assert t.prompt_ms > 0 and t.predicted_ms > 0 and t.predicted_per_second > 0


def test_params_builders(smollm2_path):
    p = lp.LlamaParams(model_path=smollm2_path).with_n_ctx(1024).with_n_threads(2)
    assert (p.n_ctx, p.n_threads, p.flash_attn_type) == (1024, 2, lp.FlashAttnType.AUTO)
    assert p.context_params().n_ctx == 1024 and p.model_params().n_gpu_layers == "auto"


def test_generate_seed_004(llama):
    ctx = llama.context
    tokens = llama.tokenize(PROMPT)
    greedy = lp.SamplerParams(temperature=0)
    text = ctx.generate_with_params(tokens, 10, greedy)
    assert text == llama.create_completion(PROMPT, max_tokens=10).text
    ctx.clear_cache()
    ctx.eval(tokens, 0)
    assert ctx.n_past == len(tokens)
    logits = ctx.get_logits_ith(-1)
    nxt = int(np.argmax(logits))
    ctx.decode_single(nxt)
    assert ctx.n_past == len(tokens) + 1


def test_logprobs_are_a_log_softmax_and_copy_the_vocabulary_once(llama):
    import tracemalloc

    import numpy as np

    out = llama.create_completion(PROMPT, max_tokens=1, logprobs=3)
    ctx = llama.context
    ctx.clear_cache()
    ctx.eval(llama.tokenize(PROMPT), 0)
    logits = ctx.get_logits_ith(-1).astype(np.float64)
    reference = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
    got = out.logprobs[0]
    assert math.isclose(got.logprob, reference[got.token], abs_tol=1e-4)
    assert [t for t, _ in got.top] == list(np.argsort(-reference, kind="stable")[:3])
    from llamaplug.high.logprobs import LogprobReader

    reader = LogprobReader(ctx)
    reader.read(got.token, 3)  # the scratch row exists from now on
    tracemalloc.start()
    reader.read(got.token, 3)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # argpartition's index row (8 bytes a token) and small change; a float copy of the row would add 4 more.
    assert peak < llama.model.n_vocab * 8 + 64 * 1024, peak
