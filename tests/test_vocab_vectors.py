"""Tokenization against llama.cpp's own vectors (models/ggml-vocab-*.gguf + .inp/.out).

Mirrors tests/test-tokenizer-0.cpp of the pinned tree:
  * .inp is split on "\\n__ggml_vocab_test__\\n" with the same loop (a trailing
    separator does not start an empty case); .out has one line of ids per case,
    stripped and split on ' '; the cases go into a std::map, so a repeated input
    keeps its last expected ids;
  * the vocabulary is loaded with vocab_only=True after llama_backend_init();
  * each case is tokenized with common_tokenize(ctx, text, add_special=false,
    parse_special=false) and must equal the .out ids exactly;
  * on a mismatch the native test compares common_detokenize(result) with
    common_detokenize(expected), i.e. llama_detokenize(remove_special=false,
    unparse_special=true): here that comparison is asserted for every case.

Beyond the native test, the expected ids must detokenize back to the input text
(for every vocabulary except WordPiece, which lower-cases, strips accents and
maps unknowns to [UNK]); the only difference allowed is llama.cpp's
clean_up_tokenization_spaces pass, which drops a space before ? ! . , and '.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from llamaplug_testing.vocab_vectors import SEP, read_tests

import llamaplug as lp

REQUIRED = ("llama-spm", "llama-bpe", "gpt-2", "qwen2", "phi-3")
VOCAB_TYPE_WPM = 3  # LLAMA_VOCAB_TYPE_WPM
CLEANED_BEFORE = b"?!.,'"


def _only_clean_spaces(src: bytes, detok: bytes) -> bool:
    """True if `detok` is `src` minus some spaces, each right before one of ?!.,' (clean_spaces)."""
    ops = difflib.SequenceMatcher(None, src, detok, autojunk=False).get_opcodes()
    for tag, i1, i2, _j1, _j2 in ops:
        if tag == "equal":
            continue
        if tag != "delete" or src[i1:i2] != b" " or src[i2:i2 + 1] not in [bytes([c]) for c in CLEANED_BEFORE]:
            return False
    return True


def check_vocab(gguf: Path) -> tuple[int, list[str]]:
    """Run every vector of one vocabulary; returns (number of cases, failure descriptions)."""
    inp, out = Path(str(gguf) + ".inp"), Path(str(gguf) + ".out")
    assert inp.is_file() and out.is_file(), f"missing {inp.name} / {out.name}"
    tests, _, _ = read_tests(inp, out)
    assert tests, f"{gguf.name}: no tests found"

    lp.LlamaBackend.init()
    failures: list[str] = []
    with lp.LlamaModel(gguf, lp.ModelParams(vocab_only=True)) as model:
        lossy = model.vocab_type == VOCAB_TYPE_WPM
        for src, expected in tests.items():
            text = src.decode("utf-8")  # every vector input is UTF-8; a decode error fails the test
            got = model.tokenize(text, add_bos=False, special=False)  # add_special=false, parse_special=false
            if got != expected:
                failures.append(f"tokens {src[:60]!r}: got {got[:16]} ({len(got)}), expected {expected[:16]} "
                                f"({len(expected)})")
            # the native test's comparison: common_detokenize(res) vs common_detokenize(expected)
            detok_got = model.detokenize_bytes(got, special=True)
            detok_exp = model.detokenize_bytes(expected, special=True)
            if detok_got != detok_exp:
                failures.append(f"detokenize {src[:60]!r}: {detok_got[:60]!r} != {detok_exp[:60]!r}")
            if not lossy and detok_exp != src and not _only_clean_spaces(src, detok_exp):
                failures.append(f"round trip {src[:60]!r}: expected ids detokenize to {detok_exp[:60]!r}")
    return len(tests), failures


@pytest.mark.parametrize("name", REQUIRED)
def test_vocab_vectors(llama_cpp_dir: Path, name: str) -> None:
    gguf = llama_cpp_dir / "models" / f"ggml-vocab-{name}.gguf"
    assert gguf.is_file(), f"{gguf} is missing from the pinned tree"
    n, failures = check_vocab(gguf)
    assert n >= 10, f"{name}: only {n} cases read"
    assert not failures, f"{name}: {len(failures)} failures in {n} cases:\n" + "\n".join(failures[:20])


def test_other_vocab_vectors(llama_cpp_dir: Path) -> None:
    """Every other ggml-vocab-*.gguf of the tree that ships .inp/.out vectors."""
    others = sorted(
        p for p in (llama_cpp_dir / "models").glob("ggml-vocab-*.gguf")
        if p.name[len("ggml-vocab-"):-len(".gguf")] not in REQUIRED
        and Path(str(p) + ".inp").is_file() and Path(str(p) + ".out").is_file()
    )
    assert others, "no further vocabularies with vectors found"
    report: list[str] = []
    total = 0
    for gguf in others:
        n, failures = check_vocab(gguf)
        total += n
        if failures:
            report.append(f"{gguf.name}: {len(failures)} failures in {n} cases:\n  " + "\n  ".join(failures[:10]))
    assert not report, f"{len(report)} of {len(others)} vocabularies failed ({total} cases):\n" + "\n".join(report)


def test_read_tests_matches_native_splitting(tmp_path: Path) -> None:
    """The .inp splitting mirrors the C++ loop: a trailing separator adds no empty case."""
    inp, out = tmp_path / "v.inp", tmp_path / "v.out"
    inp.write_bytes(b"a" + SEP + b"" + SEP + b"b c" + SEP)
    out.write_bytes(b" 1 2 \n\n3\n")
    tests, n_inp, n_out = read_tests(inp, out)
    assert (n_inp, n_out) == (3, 3)
    assert tests == {b"a": [1, 2], b"": [], b"b c": [3]}
