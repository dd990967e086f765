"""The prompt cache's RAM and disk tiers under a hypothesis state machine (issue 46): requests over a few shared
prefixes, RAM pressure that spills them to disk, restarts, damaged files, a lower disk limit and a second Llama
on the same directory, in any order.

After every step: the directory holds at most the limit (the smallest of the open Llamas'), nothing is written
beside it, every warning names a file the test damaged (at most one per damage, and that file is gone), no damaged
file's bytes were ever handed to a context, and every greedy reply equals a cold read's, bit for bit.

The Llamas run with cache_exact and n_ubatch 64 (the disk tier's block): a reused prefix (slot, RAM or disk)
ends on a multiple of 64, so the rest of the prompt is read in the ubatches a cold read uses. The reference is a
cold read: a cache-less Llama with the same n_ubatch reads the whole prompt into an empty sequence; its tokens
and logprobs must be the reply's. Prompts are token lists, a prefix then a suffix whose first token no other
suffix starts with, so the tokens a prompt shares with anything cached are 0, 1 (BOS), the prefix, or all but
the last (a repeat), and `k` (cached) is one of those cut to a multiple of 64.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from llamaplug_testing import THREADS

import llamaplug as lp
from llamaplug.high import disk_store
from llamaplug.high.disk_store import DiskStore, disk_usage

N_CTX = 512
# ~100 tokens each (a disk file needs one full 64-token block); SmolLM2's KV is ~23 KB a token, so one sequence
# is ~2.5 MB: a 3 MiB RAM tier holds one, and the disk limits below hold one to three
PREFIXES = [
    "The librarian of a small town keeps a ledger. " + " ".join(f"Shelf {i} holds books on topic number {i}."
                                                                for i in range(9)),
    "Minutes of the chess club meeting. " + " ".join(f"Member {i} played opening number {i} and lost."
                                                     for i in range(8)),
    "A recipe for bread from grandmother's notebook. " + " ".join(f"Step {i}: knead the dough for {i} minutes."
                                                                 for i in range(8)),
]
SUFFIXES = ["\nQ: Which shelf holds topic 3?\nA:", " Who wrote this?", " Summary:", " In short,", " The next line says"]
RAM_MIB = 3
DISK_MIB = [3, 6, 9]
MAX_TOKENS = 4
N_UBATCH = disk_store.BLOCK


def load(path, cache_dir, disk_mib: int) -> lp.Llama:
    return lp.Llama.load(lp.LlamaParams(path, n_ctx=N_CTX, n_threads=THREADS, n_ubatch=N_UBATCH, cache_exact=True,
                                        cache_ram_mib=RAM_MIB, cache_dir=cache_dir, cache_disk_mib=disk_mib))


def complete(llm: lp.Llama, prompt: list[int]) -> tuple[str, list[int], str, int]:
    """The greedy reply: its text, tokens, logprobs (repr: every bit) and the prompt tokens found cached."""
    out = llm.create_completion(prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=1)
    return out.text, out.tokens, repr(out.logprobs), out.timings.cached_tokens


def settle(llm: lp.Llama) -> None:
    """Wait for the disk tier's queued writes (its writer thread), so each step starts from the same files."""
    disk = llm.engine._store.disk
    deadline = time.monotonic() + 60
    while disk._pending and time.monotonic() < deadline:
        time.sleep(0.01)


class Reference:
    """A cache-less Llama reading each prompt cold: whole, into an empty sequence, in ubatches of N_UBATCH."""

    def __init__(self, path):
        self.llm = lp.Llama.load(lp.LlamaParams(path, n_ctx=N_CTX, n_threads=THREADS, n_ubatch=N_UBATCH,
                                                cache_ram_mib=0))
        self.prefixes = [self.llm.tokenize(p) for p in PREFIXES]
        self.suffixes = [self.llm.tokenize(s, add_bos=False) for s in SUFFIXES]
        assert len({s[0] for s in self.suffixes}) == len(SUFFIXES)
        assert len({p[1] for p in self.prefixes}) == len(PREFIXES)
        assert all(len(p) > N_UBATCH for p in self.prefixes)  # each prefix gives a cached block
        self._memo: dict[tuple[int, ...], tuple[str, list[int], str]] = {}

    def reply(self, prompt: list[int]) -> tuple[str, list[int], str]:
        key = tuple(prompt)
        if key not in self._memo:
            with self.llm.engine.idle("reference") as slots:
                for tokens in slots:
                    tokens.clear()  # nothing reused: the slot's sequence is emptied (its cells freed) first
            *reply, k = complete(self.llm, prompt)
            assert k == 0
            self._memo[key] = tuple(reply)
        return self._memo[key]


@pytest.fixture(scope="module")
def reference(smollm2_path):
    ref = Reference(smollm2_path)
    yield ref
    ref.llm.close()


class Watch(logging.Handler):
    """The llamaplug.cache warnings, and every load of a file whose bytes the test damaged."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.damaged: set[bytes] = set()  # sha256 of each damaged file's bytes
        self.loaded_damaged: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _truncate(raw: bytes) -> bytes:
    return raw[:len(raw) // 2]


def _flip(raw: bytes) -> bytes:
    out = bytearray(raw)
    out[len(out) * 3 // 4] ^= 0x04  # in the KV bytes
    return bytes(out)


def _other_version(raw: bytes) -> bytes:
    """Whole and checksummed, but written by another llama.cpp."""
    n_head = int.from_bytes(raw[8:12], "little")
    head = json.loads(raw[12:12 + n_head])
    head["llama_cpp"] = "0" * 40
    new_head = json.dumps(head).encode()
    data = raw[:8] + len(new_head).to_bytes(4, "little") + new_head + raw[12 + n_head:-32]
    return data + hashlib.sha256(data).digest()


DAMAGE = {"truncate": _truncate, "flip": _flip, "other_version": _other_version}
COVERED: dict[str, int] = {"disk_hits": 0, "restarts": 0, "damaged": 0, "damage_warned": 0, "second": 0,
                           "lowered": 0, "requests": 0, "cached": 0}


# A fixed seed, not derandomize's (a digest of this class's source, so every edit of the class drew other runs,
# some without a damage or a restart): seed 3's four runs meet disk hits, restarts, damage (warned), a second
# Llama and a lowered limit.
@seed(3)
class PromptCacheMachine(RuleBasedStateMachine):
    smollm2_path: Path
    ref: Reference
    watch: Watch

    @initialize(disk_mib=st.sampled_from(DISK_MIB))
    def start(self, disk_mib: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="lp-cache-machine-"))
        self.dir = self.root / "cache"
        self.limit = disk_mib
        self.llm: lp.Llama | None = load(self.smollm2_path, self.dir, disk_mib)
        self.second: lp.Llama | None = None
        self.damages: dict[str, int] = {}  # file name -> times damaged
        self.watch.messages.clear()
        self.watch.damaged.clear()

    def teardown(self) -> None:
        for llm in (getattr(self, "llm", None), getattr(self, "second", None)):
            if llm is not None:
                llm.close()
        if hasattr(self, "root"):
            shutil.rmtree(self.root, ignore_errors=True)

    def _ask(self, llm: lp.Llama, prefix: int, suffix: int) -> None:
        COVERED["requests"] += 1
        prompt = self.ref.prefixes[prefix] + self.ref.suffixes[suffix]
        hits = llm.engine.stats.cache_disk_hits
        *reply, k = complete(llm, prompt)
        COVERED["disk_hits"] += llm.engine.stats.cache_disk_hits - hits
        COVERED["cached"] += k > 0
        assert k in {n - n % N_UBATCH for n in (0, 1, len(self.ref.prefixes[prefix]), len(prompt) - 1)}, k
        cold = self.ref.reply(prompt)
        assert tuple(reply) == cold, (prefix, suffix, k, reply[0], cold[0], llm.engine.slots_cache())
        settle(llm)

    # One rule picking among the actions, not a rule each: hypothesis's rule selection turns rules off per run
    # (swarm testing), and the few runs CI affords then never met requests, restarts and damage in one run.
    # Requests are listed twice: most steps ask.
    @rule(action=st.sampled_from(["request", "request", "ram_pressure", "restart", "damage", "reopen_with_limit",
                                  "second_llama", "request"]), data=st.data())
    def step(self, action: str, data: st.DataObject) -> None:
        getattr(self, action)(data)

    def _prompt(self, data: st.DataObject) -> tuple[int, int]:
        return (data.draw(st.integers(0, len(PREFIXES) - 1), label="prefix"),
                data.draw(st.integers(0, len(SUFFIXES) - 1), label="suffix"))

    def request(self, data: st.DataObject) -> None:
        """On the first Llama, or on the second where one is open."""
        on_second = self.second is not None and data.draw(st.booleans(), label="on_second")
        self._ask(self.second if on_second else self.llm, *self._prompt(data))

    def ram_pressure(self, data: st.DataObject) -> None:
        """Every prefix in turn: each stash evicts the RAM tier's one sequence to disk."""
        suffix = data.draw(st.integers(0, len(SUFFIXES) - 1), label="suffix")
        for prefix in range(len(PREFIXES)):
            self._ask(self.llm, prefix, (suffix + prefix) % len(SUFFIXES))

    def restart(self, data: st.DataObject) -> None:
        self.llm.close()  # a clean close writes its slot's sequence and RAM entries
        self.llm = load(self.smollm2_path, self.dir, self.limit)
        COVERED["restarts"] += 1

    def reopen_with_limit(self, data: st.DataObject) -> None:
        """Both Llamas closed and opened again with another disk limit (a lower one: the directory must shrink)."""
        disk_mib = data.draw(st.sampled_from([m for m in DISK_MIB if m != self.limit]), label="disk_mib")
        for llm in (self.llm, self.second):
            if llm is not None:
                llm.close()
        COVERED["lowered"] += disk_mib < self.limit
        self.limit = disk_mib
        self.llm = load(self.smollm2_path, self.dir, disk_mib)
        self.second = load(self.smollm2_path, self.dir, disk_mib) if self.second is not None else None

    def damage(self, data: st.DataObject) -> None:
        files = sorted(p for p in self.dir.iterdir() if disk_store._NAME.fullmatch(p.name)
                       and hashlib.sha256(p.read_bytes()).digest() not in self.watch.damaged)  # (damaged: once)
        if not files:
            return
        kind = data.draw(st.sampled_from(sorted(DAMAGE)), label="kind")
        path = files[data.draw(st.integers(0, len(files) - 1), label="which")]
        tokens = disk_store.read_head(path).tokens
        raw = DAMAGE[kind](path.read_bytes())
        path.write_bytes(raw)
        self.watch.damaged.add(hashlib.sha256(raw).digest())
        self.damages[path.name] = self.damages.get(path.name, 0) + 1
        COVERED["damaged"] += 1
        # then a prompt the file would serve (unless the slot or the RAM tier holds as much)
        prefix = next(i for i, p in enumerate(self.ref.prefixes) if tokens[:len(p)] == tuple(p))
        self._ask(self.llm, prefix, data.draw(st.integers(0, len(SUFFIXES) - 1), label="suffix"))

    def second_llama(self, data: st.DataObject) -> None:
        """A second Llama on the same directory opens (another process would share only the files too), or
        closes (writing what it holds)."""
        if self.second is None:
            self.second = load(self.smollm2_path, self.dir, self.limit)
            COVERED["second"] += 1
        else:
            self.second.close()
            self.second = None

    @invariant()
    def within_the_limit(self) -> None:
        if hasattr(self, "dir"):
            assert disk_usage(self.dir) <= self.limit << 20

    @invariant()
    def nothing_beside_the_directory(self) -> None:
        if hasattr(self, "dir"):
            assert [p.name for p in self.root.iterdir()] == ["cache"]
            for p in self.dir.iterdir():
                assert p.name == "lock" or disk_store._NAME.fullmatch(p.name) or disk_store._TMP.fullmatch(p.name), p

    @invariant()
    def damaged_files_warned_once_removed_and_never_loaded(self) -> None:
        assert not self.watch.loaded_damaged, self.watch.loaded_damaged
        if not hasattr(self, "dir"):
            return
        for message in self.watch.messages:
            assert "skipping and removing" in message, message  # no other trouble (a failed write, a lookup)
            assert any(name in message for name in self.damages), message
        for name, times in self.damages.items():
            warned = sum(name in m for m in self.watch.messages)
            assert warned <= times, (name, self.watch.messages)
            if warned:
                path = self.dir / name
                assert not path.exists() or hashlib.sha256(path.read_bytes()).digest() not in self.watch.damaged
        COVERED["damage_warned"] = max(COVERED["damage_warned"], len(self.watch.messages))

    @invariant()
    def engines_run(self) -> None:
        for llm in (getattr(self, "llm", None), getattr(self, "second", None)):
            if llm is not None:
                assert llm.engine.failure is None


def test_the_prompt_cache_over_requests_evictions_restarts_damage_and_limits(smollm2_path, reference, monkeypatch):
    watch = Watch()
    real_load = DiskStore.load

    def spied_load(store, name, tokens):
        path = store.dir / f"{name}.kv"
        try:
            digest = hashlib.sha256(path.read_bytes()).digest()
        except OSError:
            digest = None
        data = real_load(store, name, tokens)
        if data is not None and digest in watch.damaged:
            watch.loaded_damaged.append(name)
        return data

    monkeypatch.setattr(DiskStore, "load", spied_load)
    logger = logging.getLogger("llamaplug.cache")
    logger.addHandler(watch)
    PromptCacheMachine.smollm2_path = smollm2_path
    PromptCacheMachine.ref = reference
    PromptCacheMachine.watch = watch
    run = PromptCacheMachine.TestCase
    # Seeded, no example database: the same draws in CI every time. No shrinking: each step reads prompts
    # and loads models, so shrinking a failure ran over 5 minutes; the failing run's steps are printed whole.
    run.settings = settings(max_examples=4, stateful_step_count=12, deadline=None, database=None, derandomize=True,
                            phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    try:
        run().runTest()
    finally:
        logger.removeHandler(watch)
    print(COVERED)
    # the runs did what the machine is for: prefixes were reused, came back from disk, files were damaged and
    # refused (not each action: a step's files, and so the draws after it, can vary with the writer thread's timing)
    assert COVERED["cached"] and COVERED["disk_hits"] and COVERED["restarts"] and COVERED["damaged"], COVERED
