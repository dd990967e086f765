"""GGUF fuzzing: corrupted files raise a LlamaError naming the file, or load and decode; never crash or hang.

The cases come from tests/fixtures/gguf_fuzz.py (deterministic: case i of a
seed is always the same file), derived from the tiny generated model and from
the header of the real SmolLM2 file. They run in a worker child (RLIMIT_AS
4 GiB, a deadline per case), so a crash fails a test instead of pytest. This
is a fixed slice of SLICE cases; the long run is

    .venv/bin/python bench/fuzz_gguf.py --cases 10000 --seed 1

The files that crashed the pinned llama.cpp before llamaplug's guards (in
blocks/gguf_header.py and blocks/model.py) are checked one by one as well.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from fixtures import gguf_fuzz
from fixtures.tiny_gguf import N_VOCAB, write_tiny_model
from llamaplug_testing import THREADS, run_isolated

SEED = 20240601
SLICE = 300


@pytest.fixture(scope="module")
def fuzz_report(smollm2_path) -> gguf_fuzz.Report:
    return gguf_fuzz.run_cases(SEED, range(SLICE), smollm2=smollm2_path, case_timeout=30.0)


def _show(results: list[dict]) -> str:
    keep = ("case", "outcome", "signal", "base", "mutator", "detail", "stage", "cls", "msg", "reproduced", "stderr")
    return "\n".join(json.dumps({k: r.get(k) for k in keep})[:3000] for r in results[:10])


def test_no_crash_no_hang(fuzz_report):
    counts = fuzz_report.counts()
    print(json.dumps(counts))
    bad = [r for r in fuzz_report.results if r["outcome"] in ("crash", "timeout")]
    assert not bad, f"{len(bad)} crash(es)/hang(s) in {counts}:\n{_show(bad)}"


def test_every_failure_is_a_llama_error(fuzz_report):
    bad = [r for r in fuzz_report.results if r["outcome"] not in ("loaded", "error")]
    assert not bad, f"not a LlamaError (or a bad sample):\n{_show(bad)}"
    import llamaplug as lp

    for r in fuzz_report.results:
        if r["outcome"] == "error":
            cls = getattr(lp, r["cls"], None)
            assert isinstance(cls, type) and issubclass(cls, lp.LlamaError), r


def test_every_failure_names_the_file(fuzz_report):
    unnamed = []
    for r in fuzz_report.results:
        if r["outcome"] != "error":
            continue
        # Load errors carry the path; later ones (context, decode) at least the file's name.
        wanted = r["path"] if r["stage"] == "load" else Path(r["path"]).name
        if wanted not in r["msg"]:
            unnamed.append(r)
    assert not unnamed, f"messages that do not name the file:\n{_show(unnamed)}"


def test_slice_covers_both_bases_and_every_mutator(fuzz_report):
    results = fuzz_report.results
    assert {r["base"] for r in results} == {"tiny", "smollm2"}
    seen = {r["mutator"] for r in results}
    missing = {name for name, (weight, _) in gguf_fuzz.MUTATORS.items() if weight >= 1} - seen
    assert not missing, missing
    counts = fuzz_report.counts()
    assert counts["loaded"] >= SLICE // 20 and counts["llama_error"] >= SLICE // 2, counts


def test_cases_are_deterministic(smollm2_path):
    for index in (0, 1, 7, 123):
        a = gguf_fuzz.make_case(SEED, index, smollm2_path)
        b = gguf_fuzz.make_case(SEED, index, smollm2_path)
        assert (a.prefix, a.size, a.detail) == (b.prefix, b.size, b.detail)
    assert gguf_fuzz.make_case(SEED, 0, smollm2_path).prefix != gguf_fuzz.make_case(SEED + 1, 0, smollm2_path).prefix


def test_a_callers_edit_of_a_base_reaches_no_case(smollm2_path):
    """test_inspect edits tiny_base()'s tensor offsets; when it ran first in the same worker the cached parse kept
    the edit and this slice loaded 10 of 300 cases instead of 58 (CI of stop 52)."""
    cases = range(30)  # case 26 is the first on SmolLM2
    before = [gguf_fuzz.make_case(SEED, i, smollm2_path).prefix for i in cases]
    for g in (gguf_fuzz.tiny_base(), gguf_fuzz.smollm2_base(str(smollm2_path))):
        g.tensors[1].offset += 32
        g.tensors.pop()
        g.kvs.pop()
    assert [gguf_fuzz.make_case(SEED, i, smollm2_path).prefix for i in cases] == before


def test_smollm2_cases_write_only_the_header(smollm2_path, tmp_path):
    """A SmolLM2 case is its first few MB; the rest of the file is a hole (no 98 MB copy per case)."""
    case = next(c for c in (gguf_fuzz.make_case(SEED, i, smollm2_path) for i in range(200))
                if c.base == "smollm2" and c.size > len(c.prefix))
    assert len(case.prefix) < 4 << 20
    path = case.write(tmp_path / "case.gguf")
    assert path.stat().st_size == case.size
    assert path.stat().st_blocks * 512 < 8 << 20  # allocated blocks: the header only


def test_tiny_model_loads_and_decodes(tmp_path):
    import llamaplug as lp

    path = write_tiny_model(tmp_path / "tiny.gguf")
    assert path.stat().st_size < 64 << 10
    with lp.Llama.load(lp.LlamaParams(model_path=path, n_ctx=64, n_threads=THREADS)) as llama:
        model = llama.model
        assert model.n_vocab == N_VOCAB and model.n_layer == 2 and model.n_embd == 32
        tokens = llama.tokenize("hello the world")
        assert llama.detokenize(tokens) == "hello the world"
        done = llama.create_completion(tokens, max_tokens=4)
        assert len(done.tokens) <= 4 and all(0 <= t < N_VOCAB for t in done.tokens)


# -- the crashes found upstream, one file each ----------------------------------------------------

KNOWN = gguf_fuzz.known_crashes()


@pytest.fixture(scope="module")
def known_results(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("known_crashes")
    files = {}
    for k in KNOWN:
        (root / f"{k.name}.gguf").write_bytes(k.data)
        files[k.name] = {"path": str(root / f"{k.name}.gguf"), "stage": k.stage, "use_mmap": k.use_mmap}
    proc = run_isolated(textwrap.dedent(f"""
        import json
        import llamaplug as lp
        lp.LlamaBackend.init()
        files = json.loads({json.dumps(files)!r})
        for name, f in files.items():
            stage = "load"
            try:
                model = lp.LlamaModel(f["path"], lp.ModelParams(use_mmap=f["use_mmap"]))
                stage = "tokenize"
                if f["stage"] == "tokenize":
                    model.tokenize("hello the world", add_bos=True)
                stage = "decode"
                ctx = lp.LlamaContext(model, lp.ContextParams(n_ctx=64, n_threads=1))
                ctx.decode_single(0)
                out = {{"outcome": "ok"}}
            except lp.LlamaError as e:
                out = {{"outcome": "error", "cls": type(e).__name__, "msg": str(e), "stage": stage}}
            print("RESULT", name, json.dumps(out), flush=True)
        # The misaligned file loads when mmap is left to llamaplug (it copies instead).
        model = lp.LlamaModel(files["misaligned_data_mmap"]["path"])
        ctx = lp.LlamaContext(model, lp.ContextParams(n_ctx=64, n_threads=1))
        ctx.decode_single(0)
        print("MISALIGNED_AUTO_OK", flush=True)
        """), timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            _, name, payload = line.split(" ", 2)
            results[name] = dict(json.loads(payload), path=files[name]["path"])
    results["__auto__"] = {"ok": "MISALIGNED_AUTO_OK" in proc.stdout}
    return results


@pytest.mark.parametrize("known", KNOWN, ids=[k.name for k in KNOWN])
def test_known_upstream_crash_is_refused(known_results, known):
    r = known_results[known.name]
    assert r["outcome"] == "error", f"{known.name} ({known.upstream}) was not refused: {r}"
    assert (r["stage"], r["cls"]) == (known.stage, known.expected), r
    assert known.fragment in r["msg"], r["msg"]
    assert Path(r["path"]).name in r["msg"], r["msg"]


def test_misaligned_file_loads_without_mmap(known_results):
    assert known_results["__auto__"]["ok"]
