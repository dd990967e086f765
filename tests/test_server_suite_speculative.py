"""llama-server's synthetic draft acceptance (--spec-synth-rates / --spec-synth-len), as the pin's test_speculative.py
asks it (issue 48 part 6): a benchmarking mode where each drafted guess is accepted at random, at a rate per draft
position, whatever the target samples (speculative.SynthAcceptance).

Against the pin's llama-server (the same SmolLM2 as target and draft model, draft-simple, the suite's draft sizes): the
same replies, token for token, and the same draft_n / draft_n_accepted, since the decisions come from the same
mt19937 seeded with the request's seed; a grammar request and an ignore_eos one (a drafted end-of-generation token is
never accepted) as the suite sends them. The engine with a real model: rates all 0 give the tokens of no drafting,
rates all 1 accept every guess.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from llamaplug_testing import THREADS, free_port, llamaplug_server, post_status
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
