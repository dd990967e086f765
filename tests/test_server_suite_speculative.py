"""llama-server's synthetic draft acceptance (--spec-synth-rates / --spec-synth-len) and context shift
(--context-shift), as the pin's test_speculative.py asks them (issue 48 part 6). Synthetic acceptance is a
benchmarking mode where each drafted guess is accepted at random, at a rate per draft position, whatever the target
samples (speculative.SynthAcceptance).

Against the pin's llama-server (the same SmolLM2 as target and draft model, draft-simple, the suite's draft sizes): the
same replies, token for token, and the same draft_n / draft_n_accepted, since the decisions come from the same
mt19937 seeded with the request's seed; a grammar request and an ignore_eos one (a drafted end-of-generation token is
never accepted) as the suite sends them. The engine with a real model: rates all 0 give the tokens of no drafting,
rates all 1 accept every guess.

Context shift: a reply that fills its slot drops half of the slot's tokens after the BOS and goes on (engine.py,
Slot.shift). Against llama-server, drafting with the draft model as the suite's test_with_ctx_shift: the same tokens
past several shifts, the same draft counts, `truncated`; without the flag both end at the full slot, `truncated` too.
The engine: the tokens asked for, drafting or not the same greedy text, and nothing of the shifted cells reused.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from llamaplug_testing import THREADS, free_port, llama_server, llamaplug_server, on_both, post_status
from llamaplug_testing.servers import _serving

import llamaplug as lp
from llamaplug.high.speculative import synth_rates

N_MAX = 8  # the suite's spec_draft_n_max (and n_min 4)
PROMPT = "I believe the meaning of life is"
SAMPLED = {"temperature": 0.2, "top_k": 5, "seed": 4242}  # the suite's test_with_and_without_draft
REQUESTS = [
    {"prompt": PROMPT, "temperature": 0.0, "seed": 4242, "n_predict": 32},
    {"prompt": PROMPT, **SAMPLED, "n_predict": 32},
    {"prompt": PROMPT, **SAMPLED, "n_predict": 32},  # again: the same decisions (test_synth_is_deterministic)
    {"prompt": PROMPT, "temperature": 0.0, "seed": 4242, "n_predict": 6, "grammar": 'root ::= "a"{5,5}'},
    {"prompt": "Respond with only: OK", "temperature": 0.0, "seed": 4242, "n_predict": 64, "ignore_eos": True},
]


def _script(port: int) -> list[tuple]:
    out = []
    for request in REQUESTS:
        status, body = post_status(port, "/completion", {**request, "return_tokens": True}, timeout=600)
        timings, tokens, predicted = body.get("timings", {}), body.get("tokens"), body.get("tokens_predicted")
        if body.get("stop_type") == "eos":  # (llama-server lists the end-of-generation token, serve does not)
            tokens = tokens[:predicted - 1]
        out.append((status, tokens, body.get("stop_type"), predicted,
                    timings.get("draft_n"), timings.get("draft_n_accepted")))
    return out


def _spec(model) -> list[str]:
    # -t 1: a drafter makes many small decodes, each a barrier for every thread (test_speculative.py's THREADS)
    return ["-t", "1", "-md", str(model), "--spec-type", "draft-simple", "--spec-draft-n-min", "4",
            "--spec-draft-n-max", str(N_MAX), "--spec-draft-p-min", "0", "-c", "1024"]


def _logged_rates(log: str) -> str:
    found = re.search(r"synthetic acceptance: n_max = (\d+), mean length = ([\d.]+), rates = \[(.*)\]", log)
    assert found, log[-2000:]
    return found.group(0)


def test_synthetic_acceptance_as_llama_server(native_tools, smollm2_path, tmp_path):
    args = [*_spec(smollm2_path), "--spec-synth-len", "3.5"]
    port = free_port()
    log = tmp_path / "llama-server.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([str(native_tools / "llama-server"), "-m", str(smollm2_path), "--host", "127.0.0.1",
                                 "--port", str(port), "-t", str(THREADS), "-np", "1", *args],
                                stdout=subprocess.DEVNULL, stderr=sink, text=True)
        for ready in _serving(proc, port, "llama-server", term_again_after=3):
            theirs = _script(ready)
    with llamaplug_server(smollm2_path, "-np", "1", *args) as (ready, ours_proc):
        ours = _script(ready)
    ours_log = ours_proc.stderr.read()
    assert "synthetic speculative acceptance is enabled for benchmarking; generated output is not valid" in ours_log
    # the same rates from the same mean length (the pin's bisection), logged as llama-server logs them
    assert _logged_rates(ours_log) == _logged_rates(log.read_text())
    assert all(status == 200 for status, *_ in theirs)
    assert theirs[1][4] > theirs[1][5] > 0 and theirs[1] == theirs[2]  # some guesses accepted, some not; again alike
    assert theirs[4][2:4] == ("limit", 64)  # a drafted end-of-generation token is never accepted
    assert ours == theirs


@pytest.fixture(scope="module")
def synth_runs(smollm2_path):
    """The suite's sampled request through the engine: without drafting, then drafting with rates all 0 and all 1."""
    runs = {}
    for name, extra in {"plain": {}, "none": {"draft_synth_rates": [0.0] * N_MAX},
                        "all": {"draft_synth_rates": [1.0] * N_MAX}}.items():
        drafting = {"draft_model_path": smollm2_path, "draft_max": N_MAX, "draft_min": 4} if extra else {}
        with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=512, n_seq_max=1, n_threads=1, **drafting,
                                          **extra)) as llama:
            done = llama.create_completion(PROMPT, max_tokens=32, sampler=lp.SamplerParams(**SAMPLED))
            grammar = llama.create_completion(PROMPT, max_tokens=6, grammar='root ::= "a"{5,5}')
            runs[name] = done.tokens, done.timings.drafted_tokens, done.timings.accepted_tokens, grammar.stop_reason
    return runs


def test_rates_all_zero_give_the_tokens_without_drafting(synth_runs):
    tokens, drafted, accepted, _ = synth_runs["none"]
    assert tokens == synth_runs["plain"][0]
    assert drafted > 0 and accepted == 0


def test_rates_all_one_accept_every_guess(synth_runs):
    _, drafted, accepted, stop = synth_runs["all"]
    assert drafted > 0 and accepted == drafted
    assert stop is not None  # guesses the grammar refuses never reach it: the request ends normally


def test_synth_settings_are_checked_as_llama_servers():
    assert synth_rates(None, None, 8) == []
    assert synth_rates(None, 9.0, 8) == [1.0] * 8 and synth_rates(None, 1.0, 8) == [0.0] * 8
    rates = synth_rates(None, 3.0, 8)
    assert abs(sum(rates) - 2.0) < 1e-6 and rates == sorted(rates, reverse=True)
    for rates_, length, n_max, message in [
        ([1.0] * 3, None, 8, "must contain 8 values, got 3"),
        ([0.5, 0.6], None, 2, "monotonically non-increasing"),
        ([1.5, 0.5], None, 2, "finite and within \\[0, 1\\]"),
        ([float("nan"), 0.0], None, 2, "finite and within \\[0, 1\\]"),
        (None, 4.0, 2, "within \\[1, 3\\]"),
        ([1.0, 1.0], 2.0, 2, "mutually exclusive"),
        ([1.0], None, 0, "requires an initialized speculative decoding context"),
    ]:
        with pytest.raises(lp.InvalidParameterError, match=message):
            synth_rates(rates_, length, n_max)


@pytest.mark.parametrize(("flags", "code", "said"), [
    (["--spec-synth-rates", "0,1"], 1, "--spec-synth-rates: synthetic acceptance rates must contain 64 values"),
    (["--spec-type", "none", "--spec-synth-len", "2"], 1, "--spec-synth-len: synthetic acceptance requires"),
    (["--spec-synth-rates", "0,x"], 2, "argument --spec-synth-rates: invalid value"),
    (["--spec-synth-len", "-1"], 2, "argument --spec-synth-len: invalid value"),
])
def test_serve_names_the_flag_of_a_bad_synth_setting(smollm2_path, flags, code, said):
    # (as llama-server: a bad setting ends the start; checked before the model loads)
    import sys

    done = subprocess.run([sys.executable, "-m", "llamaplug.cli", "serve", "-m", str(smollm2_path), "--port", "1",
                           *flags], capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr


SHIFT_REQUESTS = [
    {"prompt": "Hello " * 248, "temperature": 0.0, "top_k": 1, "n_predict": 256},  # the suite's test_with_ctx_shift
    {"prompt": "Once upon a time", "temperature": 0.0, "n_predict": 300},
]


def _shift_script(port: int) -> list[tuple]:
    out = []
    for request in SHIFT_REQUESTS:
        status, body = post_status(port, "/completion", {**request, "return_tokens": True}, timeout=600)
        out.append((status, body.get("tokens"), body.get("tokens_predicted"), body.get("truncated"),
                    body.get("stop_type"), body.get("timings", {}).get("draft_n")))
    return out


def test_context_shift_as_llama_server(native_tools, smollm2_path):
    args = [*_spec(smollm2_path), "-c", "256", "--context-shift"]  # (-c: the last one counts)
    with llama_server(native_tools, smollm2_path, *args) as port:
        theirs = _shift_script(port)
    with llamaplug_server(smollm2_path, "-np", "1", *args) as (port, _):
        ours = _shift_script(port)
    assert [row[2:5] for row in theirs] == [(256, True, "limit"), (300, True, "limit")]
    assert theirs[0][5] > 0  # drafted across the shifts
    assert ours == theirs


def test_a_full_slot_is_truncated_as_llama_servers(native_tools, smollm2_path):
    request = {"prompt": "Hello " * 100, "temperature": 0.0, "n_predict": -1}  # as test_ctx_shift's disabled case
    both = on_both(native_tools, smollm2_path, lambda port: post_status(port, "/completion", request, timeout=600),
                   "-t", "1", "-c", "256", "--spec-type", "none")
    (status, theirs), (_, ours) = both["theirs"], both["ours"]
    assert status == 200 and theirs["truncated"] is True and theirs["stop_type"] == "limit"
    assert (ours["truncated"], ours["stop_type"], ours["tokens_predicted"], ours["content"]) == (
        theirs["truncated"], theirs["stop_type"], theirs["tokens_predicted"], theirs["content"])


@pytest.fixture(scope="module")
def shift_runs(smollm2_path):
    """A greedy reply far past a 256-token slot, with context shift, without and with drafting (n-grams)."""
    runs = {}
    for name, extra in {"plain": {}, "draft": {"draft_model_path": smollm2_path, "draft_max": N_MAX}}.items():
        with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=256, n_seq_max=1, n_threads=1, context_shift=True,
                                          **extra)) as llama:
            first = llama.create_completion("Once upon a time", max_tokens=400)
            with llama.engine.idle("a look at the slot") as slots:  # what the slot keeps for a later prompt
                kept = list(slots[0]), llama.context.kv_cache_seq_pos_max(0)
            again = llama.create_completion("Once upon a time", max_tokens=400)
            runs[name] = first, again, kept
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=256, n_seq_max=1, n_threads=1)) as llama:
        runs["off"] = llama.create_completion("Once upon a time", max_tokens=400)
    return runs


def test_context_shift_gives_the_tokens_asked_for(shift_runs):
    first, again, _ = shift_runs["plain"]
    assert len(first.tokens) == 400 and first.stop_reason == lp.StopReason.MAX_TOKENS
    assert first.timings.context_shifts >= 2
    off = shift_runs["off"]  # the default: the reply ends at the full slot
    assert off.stop_reason == lp.StopReason.CONTEXT_FULL and off.timings.context_shifts == 0
    assert first.tokens[:len(off.tokens)] == off.tokens  # the same text up to the first shift


def test_nothing_of_the_shifted_cells_is_reused(shift_runs):
    first, again, (tokens, last_cell) = shift_runs["plain"]
    # The moved cells hold what the dropped tokens made of them: the slot keeps (and its cache holds) only the
    # tokens before the shift (SmolLM2 adds no BOS: none), not the shifted list a prompt could match.
    assert tokens == [] and last_cell == -1
    assert again.tokens == first.tokens and again.timings.cached_tokens == 0


def test_drafting_follows_the_shift(shift_runs):
    # The model drafting for itself: its context shifts as the target's (ModelDrafter.shifted), so its guesses
    # stay the target's own past every shift (a draft context left behind would guess from the wrong positions).
    first, again, _ = shift_runs["draft"]
    assert len(first.tokens) == 400 and first.timings.context_shifts >= 2
    assert first.timings.accepted_tokens >= 0.9 * first.timings.drafted_tokens > 0
    assert again.tokens == first.tokens
