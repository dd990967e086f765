"""Third-party sampler plugins run inside llama.cpp's own chain.

The example distribution in tests/sampler_plugin_example is installed into the test
environment (tox) through its entry point, so these tests see it as a user would.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import llamaplug as lp
from llamaplug import plugins

PROMPT = "The capital of France is"


def test_the_example_distribution_is_discovered_through_its_entry_point():
    found = plugins.sampler_factories()
    assert {"ban", "argmax", "noop", "explode"} <= set(found)
    assert {found[n].distribution for n in ("ban", "argmax", "noop", "explode")} == {"llamaplug-sampler-example"}


def test_llamaplug_info_lists_the_samplers_with_their_distribution():
    done = subprocess.run([sys.executable, "-m", "llamaplug.cli", "info"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.strip().startswith("ban "))
    assert "[llamaplug-sampler-example]" in line


def test_ban_changes_the_output_as_designed(llama):
    greedy = llama.create_completion(PROMPT, 12).tokens
    banned = greedy[0]
    out = llama.create_completion(PROMPT, 12, sampler=lp.SamplerChain().add("ban", tokens=[banned]).greedy()).tokens
    assert out[0] != banned and banned not in out


def test_a_python_sampler_that_selects_replaces_the_appended_dist(llama):
    chain = lp.SamplerChain().add("argmax")
    assert llama.create_completion(PROMPT, 12, sampler=chain).tokens == llama.create_completion(PROMPT, 12).tokens
    assert "dist" not in chain._describe()


def test_python_and_native_samplers_compose_in_one_chain(llama):
    ctx = llama.context
    ctx.clear_cache()
    ctx.eval(llama.model.tokenize(PROMPT), 0)
    top5 = np.argsort(-ctx.get_logits_ith(-1))[:5].tolist()
    for seed in range(8):
        chain = lp.SamplerChain(seed=seed).top_k(5).add("ban", tokens=[top5[0]]).temp(2.0).dist()
        first = llama.create_completion(PROMPT, 1, sampler=chain).tokens[0]
        assert first in top5[1:]  # after top_k (native), without the banned one (Python), drawn by dist (native)


def test_an_exception_in_apply_surfaces_and_the_chain_stays_usable(llama):
    chain = lp.SamplerChain(seed=1).add("explode", times=1).top_k(1).dist()
    with pytest.raises(RuntimeError, match="exploded on purpose"):
        llama.create_completion(PROMPT, 4, sampler=chain)
    assert llama.create_completion(PROMPT, 4, sampler=chain).tokens == llama.create_completion(PROMPT, 4).tokens


def test_unknown_sampler_names_the_known_ones():
    with pytest.raises(lp.InvalidParameterError) as err:
        lp.SamplerChain().add("nucleus")
    assert "'nucleus'" in str(err.value) and "'ban'" in str(err.value)


class Recorder:
    """An in-process Python sampler that looks at everything the interface gives it."""

    def __init__(self, keep=None, fail_accept=False):
        self.seen, self.accepted, self.resets, self.keep_n, self.fail_accept = [], [], 0, keep, fail_accept

    def apply(self, c):
        ids, logits = c.ids, c.logits
        assert ids.base is not None or ids.flags.writeable  # a view, not a copy
        self.seen.append((len(c), c.sorted, c.selected, int(ids[0])))
        if self.keep_n:
            order = np.argsort(-logits)
            ids[:] = ids[order]
            logits[:] = logits[order]
            c.sorted = True
            c.keep(self.keep_n)

    def accept(self, token):
        if self.fail_accept:
            raise ValueError("accept refused")
        self.accepted.append(token)

    def reset(self):
        self.resets += 1


def test_candidates_views_keep_accept_and_reset(llama):
    rec = Recorder(keep=1)
    chain = lp.SamplerChain(seed=3).add(rec).dist()
    out = llama.create_completion(PROMPT, 6, sampler=chain).tokens
    assert out == llama.create_completion(PROMPT, 6).tokens  # keeping the best one is greedy
    assert rec.seen[0][:3] == (llama.model.n_vocab, False, -1)
    assert rec.accepted[: len(out)] == out
    chain.reset()
    assert rec.resets == 1


def test_an_exception_in_accept_surfaces_after_the_native_call(llama):
    chain = lp.SamplerChain(seed=3).add(Recorder(fail_accept=True)).top_k(1).dist()
    with pytest.raises(ValueError, match="accept refused"):
        llama.create_completion(PROMPT, 2, sampler=chain)


def test_setting_selected_out_of_range_is_an_error_in_the_sampler(llama):
    class Bad:
        selects = True

        def apply(self, c):
            c.selected = len(c) + 5

    with pytest.raises(lp.InvalidParameterError, match="selected="):
        llama.create_completion(PROMPT, 2, sampler=lp.SamplerChain().add(Bad()))


def test_an_object_without_apply_is_refused():
    with pytest.raises(lp.InvalidParameterError, match="no apply"):
        lp.SamplerChain().add(object())
