"""llama.cpp's tokenizer test vectors (models/ggml-vocab-*.inp/.out), read as tests/test-tokenizer-0.cpp reads them.

Used by tests/test_vocab_vectors.py (llama.cpp's own tokenizer) and the tokenizer-hf plugin's tests.
"""

from __future__ import annotations

from pathlib import Path

SEP = b"\n__ggml_vocab_test__\n"


def _strip(line: bytes) -> bytes:
    """common.cpp string_strip: trim std::isspace characters on both ends."""
    return line.strip(b" \t\n\v\f\r")


def read_tests(inp: Path, out: Path) -> tuple[dict[bytes, list[int]], int, int]:
    """test-tokenizer-0.cpp read_tests(): {input bytes: expected ids}, plus the raw case counts."""
    sraw = inp.read_bytes()
    sout = out.read_bytes().split(b"\n")
    if sout and sout[-1] == b"":  # std::getline yields no line after a final newline
        sout.pop()

    sinp: list[bytes] = []
    pos = 0
    while pos < len(sraw):
        nxt = sraw.find(SEP, pos)
        if nxt == -1:
            sinp.append(sraw[pos:])
            break
        sinp.append(sraw[pos:nxt])
        pos = nxt + len(SEP)

    assert len(sinp) == len(sout), (
        f"{inp.name}: {len(sinp)} inputs but {out.name} has {len(sout)} lines (native read_tests rejects this)"
    )
    tests: dict[bytes, list[int]] = {}
    for s, line in zip(sinp, sout):
        o = _strip(line)
        tests[s] = [int(tok) for tok in o.split(b" ")] if o else []
    return tests, len(sinp), len(sout)
