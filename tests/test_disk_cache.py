"""The prompt cache's disk tier (issue 46): a prefix read once is loaded again after a restart, and a bad file in
the cache directory is a miss with one warning, never loaded into a context.

The reference for a reply is the same requests in one process without a cache directory: a prompt whose prefix
came from disk equals `warm` (that prefix reused from the slot: the same split of the prompt between two decodes);
one whose file was refused equals `cold` (read whole). On the CPU the two can differ at a near tie (the split
changes llama.cpp's float rounding: SmolLM2 answers QUESTIONS[1] " Shelf 1\nA" read whole, " I am Shelf 1" after
the system prompt reused, from the slot or from disk alike).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time

import pytest
from llamaplug_testing import THREADS
from llamaplug_testing.child import run_isolated

import llamaplug as lp
from llamaplug.cli import main as cli_main
from llamaplug.high import disk_store
from llamaplug.high.disk_store import disk_usage, encode, file_name, read_head
from llamaplug.server.metrics import Metrics

N_CTX = 512
# ~150 tokens: two full 64-token blocks of a shared beginning, then a question
SYSTEM = ("You are the librarian of a small town. " + " ".join(f"Shelf {i} holds books on topic number {i}."
                                                               for i in range(14)))
QUESTIONS = ["\nQ: Which shelf holds topic 3?\nA:", "\nQ: Who are you?\nA:", "\nQ: Name a shelf.\nA:"]


def load(path, cache_dir=None, **options) -> lp.Llama:
    return lp.Llama.load(lp.LlamaParams(path, n_ctx=N_CTX, n_threads=THREADS, cache_dir=cache_dir, **options))


def complete(llm: lp.Llama, prompt: str):
    return llm.create_completion(prompt, max_tokens=6, temperature=0)


def forget_slots(llm: lp.Llama) -> None:
    """Nothing of what the slots hold is reused: the next prompt's prefix comes from the cache or is read."""
    with llm.engine.idle("test") as slots:
        for tokens in slots:
            tokens.clear()


def cache_files(d) -> list:
    return sorted(p for p in d.iterdir() if p.suffix == ".kv")


@pytest.fixture(scope="module")
def references(smollm2_path) -> tuple[dict[str, tuple[str, int]], dict[str, str]]:
    """warm: each question after the one before it in the same slot (text, cached tokens); cold: each read whole."""
    llm = load(smollm2_path, cache_ram_mib=0)
    try:
        warm = {q: (out.text, out.timings.cached_tokens) for q in QUESTIONS for out in [complete(llm, SYSTEM + q)]}
        cold = {}
        for q in QUESTIONS:
            forget_slots(llm)
            cold[q] = complete(llm, SYSTEM + q).text
        return warm, cold
    finally:
        llm.close()


@pytest.fixture(scope="module")
def written(smollm2_path, tmp_path_factory):
    """A cache directory a closed Llama left: one file (the first question's sequence)."""
    d = tmp_path_factory.mktemp("written")
    llm = load(smollm2_path, d)
    complete(llm, SYSTEM + QUESTIONS[0])
    llm.close()
    assert len(cache_files(d)) == 1, "a clean close writes the slot's sequence"
    return d


@pytest.fixture(scope="module")
def reader(smollm2_path, tmp_path_factory):
    """A second Llama on a cache directory (another process would be the same: nothing is shared but the files).
    With no RAM tier and its slots forgotten before each prompt, it writes nothing until its close."""
    d = tmp_path_factory.mktemp("reader")
    llm = load(smollm2_path, d, cache_ram_mib=0)
    yield llm, d
    llm.close()


@pytest.fixture(scope="module")
def q8(smollm2_path, written, tmp_path_factory):
    """A Llama with a q8_0 K cache on a copy of `written`."""
    d = tmp_path_factory.mktemp("q8")
    shutil.copytree(written, d, dirs_exist_ok=True)
    llm = load(smollm2_path, d, type_k="q8_0", cache_ram_mib=0)
    yield llm, d
    llm.close()


def fresh_copy(written, d) -> list:
    for old in cache_files(d):
        old.unlink()
    for path in cache_files(written):
        shutil.copy(path, d / path.name)
    return cache_files(d)


def test_restart_then_hit(written, reader, references, capsys):
    llm, d = reader
    fresh_copy(written, d)
    forget_slots(llm)
    before = dataclasses.replace(llm.engine.stats)
    out = complete(llm, SYSTEM + QUESTIONS[1])
    stats = llm.engine.stats
    n_system = len(llm.model.tokenize(SYSTEM))
    metrics = Metrics(lambda: [("m", llm.engine)]).render()
    assert out.timings.cached_tokens >= n_system - 2  # the shared system prompt came from disk
    assert (stats.cache_disk_hits - before.cache_disk_hits, stats.cache_disk_misses - before.cache_disk_misses) == \
        (1, 0)
    assert (out.text, out.timings.cached_tokens) == references[0][QUESTIONS[1]]
    assert f"llamaplug_cache_disk_hits_total {stats.cache_disk_hits}\n" in metrics
    # where the slot's prefix came from (/slots' prompt_cache): the disk, then, asked again, the slot's own KV
    assert ("disk", out.timings.cached_tokens) in llm.engine.slots_cache()
    again = complete(llm, SYSTEM + QUESTIONS[1])
    assert again.timings.cached_tokens > out.timings.cached_tokens
    assert ("slot", again.timings.cached_tokens) in llm.engine.slots_cache()
    assert int(re.search(r"^llamaplug_cache_disk_bytes (\d+)$", metrics, re.M).group(1)) > 0
    capsys.readouterr()
    assert cli_main(["cache", "list", str(d)]) == 0
    listing = capsys.readouterr().out
    assert f"{len(cache_files(d))} files" in listing and llm.model.path.name in listing
    assert cli_main(["cache", "clear", str(d)]) == 0
    assert not cache_files(d) and (d / "lock").exists()


def _rewrite(path, change) -> None:
    """Write `path` again with its header changed by `change(dict)` and a checksum that matches."""
    raw = path.read_bytes()
    n_head = int.from_bytes(raw[8:12], "little")
    head = json.loads(raw[12:12 + n_head])
    change(head)
    body = raw[12 + n_head:-32]
    new_head = json.dumps(head).encode()
    data = raw[:8] + len(new_head).to_bytes(4, "little") + new_head + body
    path.write_bytes(data + hashlib.sha256(data).digest())


def _truncate(path, q8) -> None:
    path.write_bytes(path.read_bytes()[:-1000])


def _flip(path, q8) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))


def _other_version(path, q8) -> None:
    _rewrite(path, lambda head: head.update(llama_cpp="0" * 40))


def _other_kv_settings(path, q8) -> None:
    """KV from a q8_0 cache, in a file that claims this context's scope (as a scope that missed a setting would)."""
    head = read_head(path)
    other = q8[0]
    forget_slots(other)
    other.context.eval(list(head.tokens), 0)
    data = other.context.state_seq_get(0)
    path.write_bytes(b"".join(encode(head.scope, head.description, head.tokens, data)))


@pytest.mark.parametrize("damage", [_truncate, _flip, _other_version, _other_kv_settings])
def test_a_bad_file_is_a_miss_with_one_warning(written, reader, q8, references, caplog, damage):
    llm, d = reader
    (path,) = fresh_copy(written, d)
    damage(path, q8)
    forget_slots(llm)
    before = dataclasses.replace(llm.engine.stats)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="llamaplug.cache"):
        out = complete(llm, SYSTEM + QUESTIONS[1])
    warnings = [r for r in caplog.records if r.name == "llamaplug.cache" and str(path) in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert out.timings.cached_tokens == 0
    assert llm.engine.stats.cache_disk_hits == before.cache_disk_hits
    assert not path.exists()
    assert out.text == references[1][QUESTIONS[1]]


def test_other_settings_files_are_left_alone(q8, references, caplog):
    """Another KV cache type's files (another model's alike) sharing the directory are neither read nor removed."""
    llm, d = q8
    theirs = set(cache_files(d))
    forget_slots(llm)
    with caplog.at_level(logging.WARNING, logger="llamaplug.cache"):
        out = complete(llm, SYSTEM + QUESTIONS[1])
    assert out.timings.cached_tokens == 0
    assert theirs <= set(cache_files(d))
    assert not [r for r in caplog.records if r.name == "llamaplug.cache"]


def test_the_disk_limit_holds(smollm2_path, tmp_path):
    d = tmp_path / "cache"
    limit_mib = 5  # SmolLM2's KV: ~23 KB a token, so one of these sequences at most
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(disk_usage(d))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    llm = load(smollm2_path, d, cache_ram_mib=0, cache_disk_mib=limit_mib)
    watcher.start()
    try:
        for i in range(3):  # each new prompt stashes the slot's last sequence: with no RAM tier, to disk
            complete(llm, f"Story {i}. " + SYSTEM + QUESTIONS[i % 3])
        llm.close()
    finally:
        stop.set()
        watcher.join()
    assert max(seen) <= limit_mib << 20
    assert disk_usage(d) <= limit_mib << 20
    assert len(cache_files(d)) == 1
    assert not [p for p in d.iterdir() if p.name.startswith("tmp-")]


def test_a_lower_limit_holds_from_the_open(smollm2_path, written, tmp_path):
    """A directory another run filled under a larger limit is brought under this one's as it opens (the state
    machine, tests/test_prompt_cache_machine.py, found it over the limit until the next write)."""
    d = tmp_path / "cache"
    shutil.copytree(written, d)
    assert disk_usage(d) > 1 << 20
    llm = load(smollm2_path, d, cache_disk_mib=1)
    try:
        assert disk_usage(d) <= 1 << 20
    finally:
        llm.close()


CHILD = """
import json, sys
import llamaplug as lp
system, questions = json.loads(sys.argv[3]), json.loads(sys.argv[4])
llm = lp.Llama.load(lp.LlamaParams(sys.argv[1], n_ctx=512, n_threads=int(sys.argv[5]), cache_dir=sys.argv[2],
                                   cache_ram_mib=0))
texts = []
for q in questions:  # each next prompt spills the last sequence to disk (no RAM tier)
    texts.append(llm.create_completion(system + q, max_tokens=6, temperature=0).text)
llm.close()
print("RESULT " + json.dumps(texts))
"""


@pytest.mark.slow  # two children each load the model and read three prompts (193 s here at load 10: ~40 s alone)
def test_two_processes_write_the_same_prefixes(smollm2_path, references, tmp_path):
    d = tmp_path / "cache"
    results: list = [None, None]

    def child(i: int) -> None:
        results[i] = run_isolated(CHILD, str(smollm2_path), str(d), json.dumps(SYSTEM), json.dumps(QUESTIONS),
                                  str(THREADS), result=True, timeout=300)

    threads = [threading.Thread(target=child, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = [references[0][q][0] for q in QUESTIONS]
    assert results == [expected, expected]
    files = cache_files(d)
    assert files
    assert not [p for p in d.iterdir() if p.name.startswith("tmp-")]
    for path in files:  # every file whole, checksummed, and named for what it holds
        raw = path.read_bytes()
        assert hashlib.sha256(raw[:-32]).digest() == raw[-32:]
        head = read_head(path)
        assert file_name(head.scope, head.tokens) == path.name[:-3]
    llm = load(smollm2_path, d)
    try:
        out = complete(llm, SYSTEM + QUESTIONS[1])
        n_system = len(llm.model.tokenize(SYSTEM))
    finally:
        llm.close()
    assert out.timings.cached_tokens >= n_system - 2  # (the children left QUESTIONS[1]'s own sequence: more)
    assert out.text == references[0][QUESTIONS[1]][0]


def test_names_stay_in_the_directory():
    assert disk_store._NAME.fullmatch(file_name("scope", list(range(100))) + ".kv")
    assert os.sep not in file_name("../../etc", [1, 2, 3])


def test_a_sliding_window_model_hits_after_a_restart(gemma_path, tmp_path):
    """Gemma-3 (a 512-token sliding window): its cache keeps the window's last positions only, so the sequence a
    question left (written after the prefill and again at the close) lacked the window the next question's prompt
    needs after the shared system prompt, and the restarted Llama read it all again (0 cached tokens, a disk hit
    counted). A disk tier turns swa_full on (high/llama.py)."""
    system = SYSTEM * 5  # ~850 tokens: past the window

    def gemma() -> lp.Llama:
        return lp.Llama.load(lp.LlamaParams(gemma_path, n_ctx=1024, n_threads=THREADS, cache_dir=tmp_path,
                                            cache_ram_mib=0))

    llm = gemma()
    try:
        assert llm.context.params.swa_full
        complete(llm, system + QUESTIONS[0])
    finally:
        llm.close()
    llm = gemma()
    try:
        out = complete(llm, system + QUESTIONS[1])
        assert out.timings.cached_tokens >= len(llm.model.tokenize(system)) - 2
        assert ("disk", out.timings.cached_tokens) in llm.engine.slots_cache()
    finally:
        llm.close()


def test_cache_exact_replies_as_a_cold_read(smollm2_path, tmp_path):
    """cache_exact: the prefix loaded after a restart ends on a multiple of n_ubatch, so the prompt's rest is read
    in the ubatches a cold read uses and the reply is the cold read's to the last bit of its logprobs (without it,
    the rest read as one ubatch from the shared prefix's end rounds otherwise on the CPU: bench/disk_cache_split.py).
    """
    def run(cache_dir, prompt):
        llm = lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=N_CTX, n_threads=THREADS, n_ubatch=64,
                                           cache_dir=cache_dir, cache_ram_mib=0, cache_exact=True))
        try:
            out = llm.create_completion(SYSTEM + prompt, max_tokens=8, logprobs=2)
            return out.timings.cached_tokens, out.tokens, repr(out.logprobs), llm.engine.slots_cache()
        finally:
            llm.close()

    cold = run(None, QUESTIONS[1])
    assert cold[0] == 0
    run(tmp_path, QUESTIONS[0])
    warm = run(tmp_path, QUESTIONS[1])
    assert warm[0] > 64 and warm[0] % 64 == 0 and ("disk", warm[0]) in warm[3]
    assert warm[1:3] == cold[1:3]
