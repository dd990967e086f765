"""Bad input raises its LlamaError subclass with a useful message, never a crash.

Every check runs in a fresh interpreter (`run_isolated`), so a segfault or an
abort in llama.cpp fails the test instead of killing pytest. Cheap checks that
share a model load run in one child, a module-scoped fixture. The child prints
one line per check:

    OK <label> <ClassName> <json: message, field, token>     the expected exception
    FAIL <label> <what happened instead>                     anything else

and exits 0; the parent asserts the exit status, the class and the message.

Each fixture's plain checks are rows of one table (`BAD_FILE_CASES`,
`PARAM_CASES`, `HUGE_CONTEXT_CASES`, `MODEL_CASES`, `CLOSED_CASES`): the label
the child prints, the exception class expected, fragments its message must
contain and the attributes (`field`, `token`) it must carry. One parametrized
test per table makes each row its own test case, with the row's id as its
name. Checks that assert more than that (timings, process health, values only
the child knows, extra output) are separate tests.
"""

from __future__ import annotations

import json
import struct
import textwrap
from pathlib import Path

import pytest
from llamaplug_testing import THREADS, run_isolated

# -- the child's side --------------------------------------------------------------

PRELUDE = '''
import json, sys, traceback
import llamaplug as lp

def expect(label, exc_name, fn):
    """Run fn; report whether it raised exactly lp.<exc_name>."""
    try:
        result = fn()
    except getattr(lp, exc_name) as e:
        if type(e).__name__ != exc_name:
            print("FAIL", label, "raised", type(e).__name__, "not", exc_name, json.dumps(str(e)), flush=True)
            return
        detail = {"message": str(e), "field": getattr(e, "field", None), "token": getattr(e, "token", None)}
        print("OK", label, type(e).__name__, json.dumps(detail), flush=True)
    except BaseException as e:
        print("FAIL", label, "raised", type(e).__name__, json.dumps(str(e)), flush=True)
        traceback.print_exc()
    else:
        print("FAIL", label, "no exception, returned", json.dumps(repr(result)[:200]), flush=True)
'''


def run_child(body: str, timeout: float = 120):
    return run_isolated(PRELUDE + textwrap.dedent(body), timeout=timeout)


def outcome(proc, label: str) -> tuple[str, dict]:
    """(class name, details) of check `label`, after asserting the child ran cleanly."""
    assert proc.returncode == 0, (
        f"child exited with {proc.returncode} (a crash?)\n"
        f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )
    for line in proc.stdout.splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 2 and parts[1] == label:
            assert parts[0] == "OK", f"{label}: {line}\nstderr:\n{proc.stderr[-3000:]}"
            return parts[2], json.loads(parts[3])
    raise AssertionError(f"{label}: the child printed no result\nstdout:\n{proc.stdout[-3000:]}\n"
                         f"stderr:\n{proc.stderr[-3000:]}")


def check(proc, label: str, exc_name: str, *fragments: str, **attrs) -> dict:
    name, detail = outcome(proc, label)
    assert name == exc_name, f"{label}: raised {name}, expected {exc_name}: {detail['message']}"
    for fragment in fragments:
        assert fragment in detail["message"], f"{label}: {fragment!r} not in the message {detail['message']!r}"
    for key, value in attrs.items():
        assert detail[key] == value, f"{label}: .{key} is {detail[key]!r}, expected {value!r}"
    return detail


# -- GGUF layout, to cut the real model inside each of its sections ------------------

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def gguf_sections(path: Path) -> dict[str, int]:
    """Offsets of a GGUF v2/v3 file: end of the metadata, end of the tensor infos, start of the data."""
    with path.open("rb") as fh:
        data = fh.read(64 << 20)  # the metadata of a small model; grown below if needed
    _, _, n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    off, alignment = 24, 32

    def skip_string(o: int) -> int:
        return o + 8 + struct.unpack_from("<Q", data, o)[0]

    def skip_value(kind: int, o: int) -> int:
        if kind == _STRING:
            return skip_string(o)
        if kind == _ARRAY:
            item, count = struct.unpack_from("<IQ", data, o)
            o += 12
            if item == _STRING:
                for _ in range(count):
                    o = skip_string(o)
                return o
            return o + _SCALAR_SIZES[item] * count
        return o + _SCALAR_SIZES[kind]

    for _ in range(n_kv):
        key_len = struct.unpack_from("<Q", data, off)[0]
        key = data[off + 8:off + 8 + key_len]
        off += 8 + key_len
        kind = struct.unpack_from("<I", data, off)[0]
        off += 4
        if key == b"general.alignment":
            alignment = struct.unpack_from("<I", data, off)[0]
        off = skip_value(kind, off)
    kv_end = off
    for _ in range(n_tensors):
        off = skip_string(off)
        n_dims = struct.unpack_from("<I", data, off)[0]
        off += 4 + 8 * n_dims + 4 + 8
    info_end = off
    data_start = (info_end + alignment - 1) // alignment * alignment
    assert data_start < path.stat().st_size
    return {"kv_end": kv_end, "info_end": info_end, "data_start": data_start}


# -- files that are not models ---------------------------------------------------------


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad_models")
    files = {"missing": root / "no_such_model.gguf", "directory": root / "a_directory.gguf"}
    files["directory"].mkdir()
    files["empty"] = root / "empty.gguf"
    files["empty"].write_bytes(b"")
    files["magic"] = root / "wrong_magic.gguf"
    files["magic"].write_bytes(b"GGML" + struct.pack("<IQQ", 3, 0, 0) + b"\0" * 64)
    files["magic_text"] = root / "text.gguf"
    files["magic_text"].write_text("this is not a model\n" * 10)
    return files


@pytest.fixture(scope="module")
def bad_file_results(bad_files):
    return run_child(f"""
        files = {json.dumps({k: str(v) for k, v in bad_files.items()})}
        lp.LlamaBackend.init()
        expect("missing", "ModelNotFoundError", lambda: lp.LlamaModel(files["missing"]))
        expect("missing_llama", "ModelNotFoundError",
               lambda: lp.Llama.load(lp.LlamaParams(model_path=files["missing"], n_ctx=256, n_threads={THREADS})))
        expect("directory", "InvalidModelError", lambda: lp.LlamaModel(files["directory"]))
        expect("empty", "InvalidModelError", lambda: lp.LlamaModel(files["empty"]))
        expect("magic", "InvalidModelError", lambda: lp.LlamaModel(files["magic"]))
        expect("magic_text", "InvalidModelError",
               lambda: lp.Llama.load(lp.LlamaParams(model_path=files["magic_text"], n_ctx=256, n_threads={THREADS})))
        """)


# (label, exception, the file whose path the message names, further message fragments)
BAD_FILE_CASES = [
    pytest.param("missing", "ModelNotFoundError", "missing", ("not found",),
                 id="missing_path_is_model_not_found"),
    pytest.param("missing_llama", "ModelNotFoundError", "missing", (),
                 id="missing_path_through_llama_load"),
    pytest.param("directory", "InvalidModelError", "directory", ("directory",),
                 id="directory_is_invalid_model"),
    pytest.param("empty", "InvalidModelError", "empty", ("empty",),
                 id="empty_file_is_invalid_model"),
    pytest.param("magic", "InvalidModelError", "magic", ("magic",),
                 id="wrong_magic_is_invalid_model"),
    pytest.param("magic_text", "InvalidModelError", "magic_text", ("not a GGUF file",),
                 id="text_file_is_invalid_model"),
]


@pytest.mark.parametrize("label,exc_name,path_key,fragments", BAD_FILE_CASES)
def test_bad_file(bad_file_results, bad_files, label, exc_name, path_key, fragments):
    check(bad_file_results, label, exc_name, str(bad_files[path_key]), *fragments)


def test_model_not_found_is_also_file_not_found():
    import llamaplug as lp

    assert issubclass(lp.ModelNotFoundError, FileNotFoundError)
    assert issubclass(lp.ModelNotFoundError, lp.LlamaError)


# -- truncated copies of the real model ------------------------------------------------

# (name, where to cut given the sections and the size, message fragments: any one of each tuple)
TRUNCATIONS = [
    ("header_magic_only", lambda s, n: 6, ("header", "magic")),
    ("header_counts", lambda s, n: 20, ("header",)),
    ("metadata_start", lambda s, n: 24 + 100, ("key-value", "metadata entries")),
    ("metadata_middle", lambda s, n: (24 + s["kv_end"]) // 2, ("key-value",)),
    ("metadata_end", lambda s, n: s["kv_end"] - 3, ("key-value",)),
    ("tensor_infos", lambda s, n: (s["kv_end"] + s["info_end"]) // 2, ("tensor info",)),
    ("tensor_data_start", lambda s, n: s["data_start"] + 1000, ("not within the file bounds",)),
    ("tensor_data_middle", lambda s, n: n // 2, ("not within the file bounds",)),
    ("tensor_data_last_byte", lambda s, n: n - 1, ("not within the file bounds",)),
]


@pytest.fixture(scope="module")
def truncated_files(smollm2_path, tmp_path_factory) -> dict[str, Path]:
    """Copies of the real model cut at each point of TRUNCATIONS."""
    sections = gguf_sections(smollm2_path)
    size = smollm2_path.stat().st_size
    root = tmp_path_factory.mktemp("truncated")
    files = {}
    with smollm2_path.open("rb") as src:
        for name, cut, _ in TRUNCATIONS:
            at = cut(sections, size)
            assert 0 < at < size, (name, at)
            src.seek(0)
            target = files[name] = root / f"truncated_{name}.gguf"
            with target.open("wb") as dst:
                remaining = at
                while remaining:
                    chunk = src.read(min(remaining, 1 << 24))
                    dst.write(chunk)
                    remaining -= len(chunk)
            assert target.stat().st_size == at
    return files


@pytest.fixture(scope="module")
def truncated_results(smollm2_path, truncated_files):
    """One child per load mode tries every truncated copy, then loads the real model."""
    results = {}
    for use_mmap in (None, False):
        results[use_mmap] = run_child(f"""
            files = {json.dumps({k: str(v) for k, v in truncated_files.items()})}
            params = lp.LlamaParams(model_path={str(smollm2_path)!r}, n_ctx=256, n_threads={THREADS},
                                    use_mmap={use_mmap!r})
            for name, path in files.items():
                expect(name, "InvalidModelError", lambda: lp.Llama.load(params.replace(model_path=path)))
            # The process is still sound: the real model loads after the failures.
            with lp.Llama.load(params) as llama:
                print("ALIVE", len(llama.tokenize("hello")), flush=True)
            """)
    return results


@pytest.mark.parametrize("use_mmap", [None, False], ids=["mmap", "no_mmap"])
@pytest.mark.parametrize("name,fragments", [(t[0], t[2]) for t in TRUNCATIONS], ids=[t[0] for t in TRUNCATIONS])
def test_truncated_model_is_invalid_model(truncated_results, truncated_files, name, fragments, use_mmap):
    proc = truncated_results[use_mmap]
    detail = check(proc, name, "InvalidModelError", str(truncated_files[name]))
    assert any(f in detail["message"] for f in fragments), f"none of {fragments} in {detail['message']!r}"


@pytest.mark.parametrize("use_mmap", [None, False], ids=["mmap", "no_mmap"])
def test_process_sound_after_truncated_models(truncated_results, use_mmap):
    proc = truncated_results[use_mmap]
    outcome(proc, TRUNCATIONS[-1][0])
    assert "ALIVE" in proc.stdout


# -- parameters ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def param_results(smollm2_path):
    return run_child(f"""
        path = {str(smollm2_path)!r}
        expect("n_ctx_negative", "InvalidParameterError",
               lambda: lp.LlamaParams(model_path=path, n_ctx=-5, n_threads={THREADS}))
        expect("unknown_field", "InvalidParameterError",
               lambda: lp.LlamaParams(model_path=path, n_ctx=256, n_threads={THREADS}, bogus_field=1))
        expect("n_threads_zero", "InvalidParameterError",
               lambda: lp.LlamaParams(model_path=path, n_ctx=256, n_threads=0))
        expect("n_ctx_wrong_type", "InvalidParameterError",
               lambda: lp.LlamaParams(model_path=path, n_ctx="lots", n_threads={THREADS}))
        good = lp.LlamaParams(model_path=path, n_ctx=256, n_threads={THREADS})
        def assign():
            good.n_ctx = -1
        expect("assignment", "InvalidParameterError", assign)
        expect("builder", "InvalidParameterError", lambda: good.with_n_batch(0))
        expect("kv_type", "InvalidParameterError", lambda: good.replace(type_k="q3_z"))
        expect("sampler_params", "InvalidParameterError", lambda: lp.SamplerParams(top_p=1.5))
        expect("vocab_only_llama", "InvalidParameterError",
               lambda: lp.Llama.load(lp.LlamaParams(model_path=path, vocab_only=True, n_threads={THREADS})))
        """)


# (label, exception, message fragments, attributes)
PARAM_CASES = [
    pytest.param("n_ctx_negative", "InvalidParameterError", ("n_ctx", "-5"), {"field": "n_ctx"},
                 id="negative_n_ctx_names_the_field"),
    pytest.param("unknown_field", "InvalidParameterError", ("bogus_field",), {"field": "bogus_field"},
                 id="unknown_field_is_invalid_parameter"),
    pytest.param("n_threads_zero", "InvalidParameterError", ("n_threads",), {"field": "n_threads"},
                 id="zero_threads_is_invalid_parameter"),
    pytest.param("n_ctx_wrong_type", "InvalidParameterError", ("n_ctx", "lots"), {"field": "n_ctx"},
                 id="wrong_type_is_invalid_parameter"),
    pytest.param("assignment", "InvalidParameterError", ("n_ctx",), {"field": "n_ctx"},
                 id="assignment_is_validated"),
    pytest.param("builder", "InvalidParameterError", ("n_batch",), {"field": "n_batch"},
                 id="builder_is_validated"),
    pytest.param("kv_type", "InvalidParameterError", ("q3_z",), {"field": "type_k"},
                 id="unknown_kv_type_is_invalid_parameter"),
    pytest.param("sampler_params", "InvalidParameterError", ("top_p",), {"field": "top_p"},
                 id="sampler_params_are_validated"),
    # before: the process aborted in llama_hparams::n_head (the context was sized from layers never loaded)
    pytest.param("vocab_only_llama", "InvalidParameterError", ("vocab_only", "weights"), {"field": "vocab_only"},
                 id="a_llama_of_a_vocab_only_model_is_refused"),
]


@pytest.mark.parametrize("label,exc_name,fragments,attrs", PARAM_CASES)
def test_bad_parameter(param_results, label, exc_name, fragments, attrs):
    check(param_results, label, exc_name, *fragments, **attrs)


def test_invalid_parameter_is_also_value_error():
    import llamaplug as lp

    with pytest.raises(ValueError):
        lp.LlamaParams(model_path="x.gguf", n_ctx=-5)


# -- a context too large for memory ----------------------------------------------------


@pytest.fixture(scope="module")
def huge_context_results(smollm2_path):
    return run_child(f"""
        import resource
        path = {str(smollm2_path)!r}
        def load(**kw):
            return lp.Llama.load(lp.LlamaParams(model_path=path, n_threads={THREADS}, **kw))
        expect("n_ctx_max_int32", "ContextTooLargeError", lambda: load(n_ctx=2**31 - 1))
        expect("n_ctx_2_26", "ContextTooLargeError", lambda: load(n_ctx=2**26))
        model = lp.LlamaModel(path)
        expect("context_direct", "ContextTooLargeError",
               lambda: lp.LlamaContext(model, lp.ContextParams(n_ctx=2**30, n_threads={THREADS})))
        expect("n_ctx_over_uint32", "InvalidParameterError", lambda: load(n_ctx=2**32 + 5))
        expect("n_seq_max_huge", "InvalidParameterError", lambda: load(n_ctx=4096, n_seq_max=10**6))
        # VmHWM is this process's own peak; ru_maxrss survives exec and so holds the forking parent's RSS (a
        # pytest worker that ran torch before this child: 2.3 GiB here, for a child that used 174 MiB)
        with open("/proc/self/status") as status:
            hwm = [line.split()[1] for line in status if line.startswith("VmHWM:")]
        peak_mib = int(hwm[0]) / 1024 if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print("COST", json.dumps({{"peak_mib": peak_mib}}), flush=True)
        with load(n_ctx=256) as llama:  # still sound afterwards
            print("ALIVE", llama.context.n_ctx, flush=True)
        """)


# (label, exception, message fragments, attributes)
HUGE_CONTEXT_CASES = [
    pytest.param("n_ctx_max_int32", "ContextTooLargeError", ("n_ctx=2147483647",), {},
                 id="n_ctx_max_int32_is_context_too_large"),
    pytest.param("n_ctx_2_26", "ContextTooLargeError", ("n_ctx=67108864", "GiB"), {},
                 id="n_ctx_beyond_memory_is_context_too_large"),
    pytest.param("context_direct", "ContextTooLargeError", ("n_ctx=1073741824",), {},
                 id="huge_context_on_a_model_directly"),
    pytest.param("n_ctx_over_uint32", "InvalidParameterError", ("n_ctx",), {"field": "n_ctx"},
                 id="n_ctx_beyond_uint32_is_invalid_parameter"),
    pytest.param("n_seq_max_huge", "InvalidParameterError", ("n_seq_max", "1000000"), {"field": "n_seq_max"},
                 id="n_seq_max_beyond_limit_is_invalid_parameter"),
]


@pytest.mark.parametrize("label,exc_name,fragments,attrs", HUGE_CONTEXT_CASES)
def test_huge_context(huge_context_results, label, exc_name, fragments, attrs):
    check(huge_context_results, label, exc_name, *fragments, **attrs)


def test_huge_context_fails_fast_without_touching_memory(huge_context_results):
    outcome(huge_context_results, "n_ctx_max_int32")
    line = next(line for line in huge_context_results.stdout.splitlines() if line.startswith("COST "))
    cost = json.loads(line.split(" ", 1)[1])
    # Fast means no gigabytes touched: llama.cpp alone zero-fills 8 GiB before failing at n_ctx=2**31-1. The peak
    # memory says so on any machine; seconds would say it only on an idle one (run_child's timeout ends a hang).
    assert cost["peak_mib"] < 2048, cost
    assert "ALIVE 256" in huge_context_results.stdout


# -- one loaded model: prompts, tokens, generation, KV cache ---------------------------


@pytest.fixture(scope="module")
def model_results(smollm2_path):
    return run_child(f"""
        import numpy as np
        llama = lp.Llama.load(lp.LlamaParams(model_path={str(smollm2_path)!r}, n_ctx=256, n_threads={THREADS}))
        ctx, model = llama.context, llama.model
        n_vocab = model.n_vocab
        print("N_VOCAB", n_vocab, flush=True)

        # Sampling before anything was decoded: a context no one has used.
        fresh = lp.LlamaContext(model, lp.ContextParams(n_ctx=256, n_threads={THREADS}))
        expect("sample_fresh", "InvalidParameterError", lambda: lp.SamplerChain().greedy().sample(fresh, -1))
        expect("logits_fresh", "InvalidParameterError", lambda: fresh.get_logits_ith(-1))
        fresh.close()

        long_prompt = " ".join(f"word{{i}}" for i in range(3000))
        expect("overflow_text", "ContextOverflowError", lambda: llama.create_completion(long_prompt, max_tokens=4))
        expect("overflow_stream", "ContextOverflowError",
               lambda: llama.create_completion(long_prompt, max_tokens=4, stream=True))
        expect("overflow_tokens", "ContextOverflowError", lambda: llama.create_completion([1] * 300))
        expect("overflow_eval", "ContextOverflowError", lambda: ctx.eval([1] * 300, 0))

        expect("detokenize", "InvalidTokenError", lambda: llama.detokenize([1, 2, n_vocab + 5]))
        expect("completion_negative", "InvalidTokenError", lambda: llama.create_completion([-1]))
        bad = lp.LlamaBatch(4, 1)
        bad.add(1, 0, (0,), False)
        bad.add(n_vocab + 7, 1, (0,), True)
        expect("batch_token", "InvalidTokenError", lambda: ctx.decode(bad))
        expect("decode_single", "InvalidTokenError", lambda: ctx.decode_single(n_vocab))
        expect("token_to_piece", "InvalidTokenError", lambda: model.token_to_piece(-3))

        expect("max_tokens", "InvalidParameterError", lambda: llama.create_completion("Hello", max_tokens=-1))
        expect("generate_max_tokens", "InvalidParameterError", lambda: ctx.generate([1, 2, 3], -2))

        expect("seq_rm", "InvalidParameterError", lambda: ctx.kv_cache_seq_rm(5))
        expect("seq_rm_negative", "InvalidParameterError", lambda: ctx.kv_cache_seq_rm(-2))
        expect("seq_cp", "InvalidParameterError", lambda: ctx.kv_cache_seq_cp(0, 1))
        seq_batch = lp.LlamaBatch(2, 1)
        seq_batch.add(1, 0, (3,), True)
        expect("batch_seq", "InvalidParameterError", lambda: ctx.decode(seq_batch))
        # A token shared by two sequences: llama.cpp's per-sequence caches answer "no KV slot" (code 1).
        coupled = lp.LlamaBatch(2, 2)
        coupled.add(1, 0, (0, 1), False)
        coupled.add(2, 1, (0, 1), True)
        for unified in (False, True):
            with lp.LlamaContext(model, lp.ContextParams(n_ctx=256, n_seq_max=2, n_threads={THREADS},
                                                         kv_unified=unified)) as two:
                if unified:
                    two.decode(coupled)
                    print("COUPLED_UNIFIED", two.kv_cache_seq_pos_max(0), two.kv_cache_seq_pos_max(1), flush=True)
                else:
                    expect("batch_coupled", "InvalidParameterError", lambda: two.decode(coupled))

        expect("surrogate_completion", "InvalidParameterError", lambda: llama.create_completion("Hi \\ud800 there"))
        expect("surrogate_tokenize", "InvalidParameterError", lambda: llama.tokenize("\\ud800"))

        # After all that, the same objects still work.
        done = llama.create_completion("The capital of France is", max_tokens=2)
        print("ALIVE", len(done.tokens), flush=True)
        llama.close()
        """)


def _n_vocab(proc) -> int:
    outcome(proc, "sample_fresh")  # asserts the child ran
    return int(next(line for line in proc.stdout.splitlines() if line.startswith("N_VOCAB ")).split()[1])


# (label, exception, message fragments, attributes); the checks on ids past n_vocab follow as tests
MODEL_CASES = [
    pytest.param("sample_fresh", "InvalidParameterError", ("no logits", "nothing decoded"), {},
                 id="sampling_before_any_decode"),
    pytest.param("logits_fresh", "InvalidParameterError", ("no logits",), {},
                 id="logits_before_any_decode"),
    pytest.param("overflow_text", "ContextOverflowError", ("n_ctx", "256"), {},
                 id="prompt_longer_than_context"),
    pytest.param("overflow_stream", "ContextOverflowError", ("n_ctx", "256"), {},
                 id="prompt_longer_than_context_streamed"),
    pytest.param("overflow_tokens", "ContextOverflowError", ("300 tokens", "256"), {},
                 id="token_prompt_longer_than_context"),
    pytest.param("overflow_eval", "ContextOverflowError", ("300 tokens", "n_ctx=256"), {},
                 id="eval_longer_than_context"),
    pytest.param("completion_negative", "InvalidTokenError", ("token id -1",), {"token": -1},
                 id="completion_with_negative_token"),
    pytest.param("token_to_piece", "InvalidTokenError", ("token id -3",), {"token": -3},
                 id="token_to_piece_bad_token"),
    pytest.param("max_tokens", "InvalidParameterError", ("max_tokens", "-1"), {"field": "max_tokens"},
                 id="negative_max_tokens"),
    pytest.param("generate_max_tokens", "InvalidParameterError", ("max_tokens", "-2"), {"field": "max_tokens"},
                 id="negative_max_tokens_in_context_generate"),
    pytest.param("seq_rm", "InvalidParameterError", ("seq_id 5", "n_seq_max"), {"field": "seq_id"},
                 id="kv_cache_seq_rm_bad_seq_id"),
    pytest.param("seq_rm_negative", "InvalidParameterError", ("seq_id -2",), {"field": "seq_id"},
                 id="kv_cache_seq_rm_negative_seq_id"),
    pytest.param("seq_cp", "InvalidParameterError", ("seq_id 1",), {"field": "seq_id"},
                 id="kv_cache_seq_cp_bad_seq_id"),
    pytest.param("batch_seq", "InvalidParameterError", ("seq_id 3", "n_seq_max"), {"field": "seq_id"},
                 id="batch_seq_id_beyond_n_seq_max"),
    pytest.param("surrogate_completion", "InvalidParameterError", ("\\ud800", "character 3"), {"field": "text"},
                 id="lone_surrogate_in_prompt"),
    pytest.param("surrogate_tokenize", "InvalidParameterError", ("\\ud800",), {"field": "text"},
                 id="lone_surrogate_in_tokenize"),
]


@pytest.mark.parametrize("label,exc_name,fragments,attrs", MODEL_CASES)
def test_bad_model_input(model_results, label, exc_name, fragments, attrs):
    check(model_results, label, exc_name, *fragments, **attrs)


def test_detokenize_out_of_vocabulary(model_results):
    bad = _n_vocab(model_results) + 5
    check(model_results, "detokenize", "InvalidTokenError", f"token id {bad}", token=bad)


def test_decode_batch_with_bad_token(model_results):
    bad = _n_vocab(model_results) + 7
    check(model_results, "batch_token", "InvalidTokenError", f"token id {bad}", "position 1", token=bad)


def test_decode_single_bad_token(model_results):
    bad = _n_vocab(model_results)
    check(model_results, "decode_single", "InvalidTokenError", f"token id {bad}", token=bad)


def test_token_in_two_sequences_needs_a_unified_cache(model_results):
    check(model_results, "batch_coupled", "InvalidParameterError", "token 0", "2 sequences", "kv_unified=True",
          field="n_seq_id")
    assert "COUPLED_UNIFIED 1 1" in model_results.stdout  # with one cache the same batch decodes


def test_model_still_works_after_bad_input(model_results):
    outcome(model_results, "surrogate_tokenize")
    assert "ALIVE 2" in model_results.stdout


# -- use after close ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def closed_results(smollm2_path):
    return run_child(f"""
        import gc
        params = lp.LlamaParams(model_path={str(smollm2_path)!r}, n_ctx=256, n_threads={THREADS})
        llama = lp.Llama.load(params)
        llama.close()
        llama.close()  # twice is fine
        expect("completion_after_close", "ClosedError", lambda: llama.create_completion("Hello", max_tokens=2))
        expect("tokenize_after_close", "ClosedError", lambda: llama.tokenize("Hello"))
        expect("context_after_llama_close", "ClosedError", lambda: llama.context.decode_single(1))

        # The model closed before its context: the context is closed with it.
        llama = lp.Llama.load(params)
        ctx = llama.context
        llama.model.close()
        expect("context_eval_after_model_close", "ClosedError", lambda: ctx.eval([1, 2, 3], 0))
        expect("context_n_ctx_after_model_close", "ClosedError", lambda: ctx.n_ctx)
        expect("context_cache_after_model_close", "ClosedError", lambda: ctx.kv_cache_seq_rm(0))

        # The same through the blocks, with the context object kept alive alone.
        model = lp.LlamaModel(params.model_path)
        context = lp.LlamaContext(model, params.context_params())
        context.eval(model.tokenize("Hello"), 0)
        model.close()
        del model
        gc.collect()
        expect("blocks_context_after_model_close", "ClosedError", lambda: context.decode_single(1))
        expect("blocks_logits_after_model_close", "ClosedError", lambda: context.get_logits_ith(-1))
        sampler = lp.SamplerChain().greedy()
        expect("sample_closed_context", "ClosedError", lambda: sampler.sample(context, -1))
        sampler.close()
        expect("closed_sampler", "ClosedError", lambda: sampler.sample(context, -1))
        del context
        gc.collect()
        print("ALIVE", flush=True)
        """)


# (label, exception, message fragments, attributes)
CLOSED_CASES = [
    pytest.param("completion_after_close", "ClosedError", ("closed",), {},
                 id="completion_after_close"),
    pytest.param("tokenize_after_close", "ClosedError", ("closed",), {},
                 id="tokenize_after_close"),
    pytest.param("context_after_llama_close", "ClosedError", ("context", "closed"), {},
                 id="context_after_llama_close"),
    pytest.param("context_eval_after_model_close", "ClosedError", ("context", "closed"), {},
                 id="context_eval_after_model_close"),
    pytest.param("context_n_ctx_after_model_close", "ClosedError", ("closed",), {},
                 id="context_property_after_model_close"),
    pytest.param("context_cache_after_model_close", "ClosedError", ("closed",), {},
                 id="context_cache_after_model_close"),
    pytest.param("blocks_context_after_model_close", "ClosedError", ("closed",), {},
                 id="blocks_context_after_model_close"),
    pytest.param("blocks_logits_after_model_close", "ClosedError", ("closed",), {},
                 id="blocks_logits_after_model_close"),
    pytest.param("sample_closed_context", "ClosedError", ("closed",), {},
                 id="sampling_on_closed_context"),
]


@pytest.mark.parametrize("label,exc_name,fragments,attrs", CLOSED_CASES)
def test_use_after_close(closed_results, label, exc_name, fragments, attrs):
    check(closed_results, label, exc_name, *fragments, **attrs)


def test_closed_sampler(closed_results):
    check(closed_results, "closed_sampler", "ClosedError", "sampler", "closed")
    assert "ALIVE" in closed_results.stdout
