"""Speculative decoding (high/speculative.py, the engine's `_verify`): the output is the target's own.

Greedy output with a drafter (n-gram lookup, or a draft model: here the same model file, which
shares the vocabulary and is cheap) must be token for token the output without one, for one
completion, several at once, and chat; and the drafters must really have drafted. The speedup and
the acceptance rate against llama.cpp's llama-speculative-simple are bench/speculative.py's.
"""

from __future__ import annotations

import pytest

import llamaplug as lp
from llamaplug import cli
from llamaplug.high.speculative import ngram_draft

SLOTS = 3
PER_SLOT = 512
# One thread: a drafter makes many one-token decodes, and with two threads each is a barrier that a busy
# machine (CI's two cores running other processes) stretches a hundredfold; the outputs do not depend on it.
THREADS = 1
# A prompt whose continuation repeats it (n-gram lookup drafts it), and ordinary ones.
REPEATING = "The quick brown fox jumps over the lazy dog. " * 6
PROMPTS = [REPEATING, "def fibonacci(n):", "Once upon a time, in a land far away,"]
CHAT = [{"role": "user", "content": "Repeat exactly: one two three four five six seven eight nine ten."}]
# Not CHAT: after its "ten" Gemma's two best tokens are 0.015 apart, and a row computed in a batch of five
# (the verification) may round the other way than in a batch of one, as in llama.cpp's own speculative decoding.
GEMMA_CHAT = [{"role": "user", "content": "Write the numbers from one to ten in words."}]
WAYS = ["plain", "ngram", "draft"]


def _load(path, way, **extra):
    # draft_max=4 for the model drafting for itself: cheaper than 16 guesses when it costs as much as the target.
    spec = {"plain": {}, "ngram": {"speculative": "ngram"}, "draft": {"draft_model_path": path, "draft_max": 4}}[way]
    return lp.Llama.load(lp.LlamaParams(path, n_ctx=SLOTS * PER_SLOT, n_seq_max=SLOTS, n_threads=THREADS,
                                        **spec, **extra))


def _outputs(llama):
    """What each way must give alike, and the drafted/accepted counts of the ways that draft."""
    one = llama.create_completion(REPEATING, max_tokens=40)
    many = llama.create_completions(PROMPTS, max_tokens=24)
    stopped = llama.create_completion(REPEATING, max_tokens=40, stop=["lazy dog. The quick"], logprobs=2)
    short = llama.create_completion(REPEATING, max_tokens=3)
    chat = llama.create_chat_completion(CHAT, max_tokens=24)
    # Each emitted token is sampled once from the target's row (as llama.cpp's speculative sampling): with
    # the same seed the draws are those of the target alone.
    sampled = llama.create_completions(PROMPTS, max_tokens=24, sampler=lp.SamplerParams(temperature=0.7, seed=1234))
    tokens = {
        "one": one.tokens, "many": [c.tokens for c in many], "stopped": (stopped.text, stopped.stop_reason),
        "logprobs": [(lp_.token, round(lp_.logprob, 2)) for lp_ in stopped.logprobs],
        "short": short.tokens, "chat": chat.choices[0].message.content, "sampled": [c.tokens for c in sampled],
    }
    timings = [one.timings, *(c.timings for c in many)]
    return tokens, sum(t.drafted_tokens for t in timings), sum(t.accepted_tokens for t in timings)


@pytest.fixture(scope="module")
def smollm2_runs(smollm2_path):
    runs = {}
    for way in WAYS:
        with _load(smollm2_path, way) as llama:
            runs[way] = _outputs(llama)
            runs[way + ".stats"] = (llama.engine.stats.drafted_tokens, llama.engine.stats.accepted_tokens)
    return runs


@pytest.mark.parametrize("way", ["ngram", "draft"])
def test_greedy_is_the_targets_own_output_smollm2(smollm2_runs, way):
    plain, _, _ = smollm2_runs["plain"]
    out, drafted, accepted = smollm2_runs[way]
    assert out == plain
    assert drafted > 0 and 0 < accepted <= drafted  # the drafter really drafted, the target really accepted
    assert smollm2_runs[way + ".stats"][0] >= drafted
    assert smollm2_runs["plain"][1] == 0


def test_a_model_drafting_for_itself_is_accepted_almost_always(smollm2_runs):
    _, drafted, accepted = smollm2_runs["draft"]
    assert accepted >= 0.9 * drafted  # same weights: only batch-shape rounding can disagree


@pytest.fixture(scope="module")
def gemma_runs(gemma_path):
    runs = {}
    for way in WAYS:
        with _load(gemma_path, way) as llama:
            done = [llama.create_completion(REPEATING, max_tokens=32),
                    *llama.create_completions(PROMPTS, max_tokens=16)]
            chat = llama.create_chat_completion(GEMMA_CHAT, max_tokens=16).choices[0].message.content
            runs[way] = ([c.tokens for c in done], chat), sum(c.timings.drafted_tokens for c in done)
    return runs


@pytest.mark.parametrize("way", ["ngram", "draft"])
def test_greedy_is_the_targets_own_output_gemma(gemma_runs, way):
    assert gemma_runs[way][0] == gemma_runs["plain"][0]
    assert gemma_runs[way][1] > 0


def test_a_draft_model_of_another_vocabulary_is_refused_at_load(smollm2_path, gemma_path):
    with pytest.raises(lp.DraftVocabMismatchError) as info:
        lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=512, n_threads=THREADS, draft_model_path=gemma_path))
    message = str(info.value)
    assert smollm2_path.name in message and gemma_path.name in message and "n_vocab" in message


def test_bad_speculative_params_name_the_field(smollm2_path):
    with pytest.raises(lp.InvalidParameterError, match="exclude each other"):
        lp.LlamaParams(smollm2_path, speculative="ngram", draft_model_path=smollm2_path)
    with pytest.raises(lp.InvalidParameterError, match="speculative"):
        lp.LlamaParams(smollm2_path, speculative="eagle")
    with pytest.raises(lp.InvalidParameterError, match="draft_max"):
        lp.LlamaParams(smollm2_path, draft_max=0)
    with pytest.raises(lp.ModelNotFoundError):
        lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=512, draft_model_path=smollm2_path.with_name("nope.gguf")))


def test_ngram_lookup_follows_llama_cpps_rules():
    history = [9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    assert ngram_draft(history, 3, n=3, m=4) == [4, 5, 6, 7]  # [1, 2] + last 3 matched at position 1
    assert ngram_draft(history, 9, n=3, m=4) == []  # no match
    assert ngram_draft(history[:8], 3, n=3, m=4) == []  # history of n + m + 1 tokens or less: none


def test_run_and_serve_take_the_drafting_flags():
    for command in ("run", "serve"):
        extra = ["hello"] if command == "run" else []
        args = cli.parser().parse_args([command, *extra, "--draft-model", "d.gguf", "--draft-max", "8",
                                        "--draft-min", "2", "--draft-p-min", "0.5"])
        assert cli._draft_params(args) == {"draft_model_path": "d.gguf", "speculative": None, "draft_max": 8,
                                           "draft_min": 2, "draft_p_min": 0.5}
        assert cli.parser().parse_args([command, *extra, "--spec", "ngram"]).spec == "ngram"
