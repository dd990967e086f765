"""`llamaplug.quantize` / `llamaplug quantize` against the pin's own llama-quantize.

The reference is llama-quantize built from the same tree: on the same input, type, options and thread
count, our output file must be byte-identical (sha256) to its output. SmolLM2's GGUF is Q4_1, so both
run with --allow-requantize on it; the IQ types run on a small F16 model (fixtures/wide_gguf.py), as
SmolLM2 takes ~13 s per IQ4_NL run. The importance matrices are written here with gguf-py (no
llama-imatrix build): values made up, but read by llama-quantize and by us from the same file.
Failures (bad type, unreadable input, refused requantize, missing imatrix) are LlamaErrors that
leave no DST and no temporary file behind.
"""

from __future__ import annotations

import hashlib
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fixtures.wide_gguf import write_wide_model
from llamaplug_testing.settings import THREADS

import llamaplug as lp
from llamaplug.blocks.gguf_info import read_gguf_info
from llamaplug.cli import main

gguf = pytest.importorskip("gguf", reason="gguf-py (tox installs it) writes the imatrix files")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def reference(native_tools: Path, src: Path, dst: Path, qtype: str, *options: str) -> str:
    run = subprocess.run([str(native_tools / "llama-quantize"), *options, str(src), str(dst), qtype, str(THREADS)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    digest = sha256(dst)
    dst.unlink()  # 100+ MB each: keep tmp small
    return digest


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """An F16 model with k-quant/IQ sized rows (fixtures/wide_gguf.py): every type quantizes it for real, fast."""
    return write_wide_model(tmp_path_factory.mktemp("wide") / "wide-f16.gguf")


@pytest.fixture(scope="module")
def weights(wide) -> list[tuple[str, int]]:
    """(name, row length) of every matrix llama-quantize may quantize."""
    return [(t.name, t.shape[0]) for t in read_gguf_info(wide).tensors if len(t.shape) >= 2]


@pytest.fixture(scope="module")
def imatrix_gguf(tmp_path_factory, weights) -> Path:
    """An imatrix in llama-imatrix's GGUF form: per tensor `.in_sum2` and `.counts` (counts 10 and 3:
    the values are divided by them), the three imatrix.* keys llama-quantize requires."""
    path = tmp_path_factory.mktemp("imatrix") / "wide.imatrix.gguf"
    rng = np.random.default_rng(21)
    writer = gguf.GGUFWriter(str(path), arch="imatrix")
    writer.add_string("general.type", "imatrix")
    writer.add_array("imatrix.datasets", ["made-up.txt"])
    writer.add_uint32("imatrix.chunk_count", 7)
    writer.add_uint32("imatrix.chunk_size", 512)
    for i, (name, n) in enumerate(weights):
        writer.add_tensor(f"{name}.in_sum2", (rng.random(n, dtype=np.float32) * 50 + 0.1).astype(np.float32))
        writer.add_tensor(f"{name}.counts", np.array([10.0 if i % 2 else 3.0], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def imatrix_legacy(tmp_path_factory, weights) -> Path:
    """The same kind of matrix in the legacy binary form (n, then name/ncall/values per entry, chunks, dataset)."""
    path = tmp_path_factory.mktemp("imatrix") / "wide.imatrix.dat"
    rng = np.random.default_rng(22)
    out = [struct.pack("<i", len(weights))]
    for name, n in weights:
        raw = name.encode()
        out += [struct.pack("<i", len(raw)), raw, struct.pack("<ii", 4, n),
                (rng.random(n, dtype=np.float32) * 20 + 0.1).astype("<f4").tobytes()]
    dataset = b"legacy.txt"
    out += [struct.pack("<i", 5), struct.pack("<i", len(dataset)), dataset]
    path.write_bytes(b"".join(out))
    return path


def check_progress(seen: list[tuple[int, int, str]], src: Path) -> None:
    # One progress call per tensor, counted as llama.cpp counts them.
    tensors = read_gguf_info(src).tensors
    assert [n for n, _, _ in seen] == list(range(1, len(tensors) + 1))
    assert {total for _, total, _ in seen} == {len(tensors)}
    assert sorted(name for _, _, name in seen) == sorted(t.name for t in tensors)


# A real model: Q8_0 (a plain type) and Q4_K_M (a k-quant mixture; its rules read the layer count).
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M"])
def test_same_bytes_as_llama_quantize(native_tools, smollm2_path, tmp_path, qtype):
    seen: list[tuple[int, int, str]] = []
    out = lp.quantize(smollm2_path, tmp_path / "ours.gguf", qtype, threads=THREADS, allow_requantize=True,
                      progress=lambda n, total, name: seen.append((n, total, name)))
    ours = sha256(out)
    out.unlink()
    assert ours == reference(native_tools, smollm2_path, tmp_path / "ref.gguf", qtype, "--allow-requantize")
    check_progress(seen, smollm2_path)
    assert leftovers(tmp_path) == []


# The F16 model: Q8_0, Q4_K_M and IQ4_NL (an IQ type the pin quantizes without an imatrix) on the same
# input; IQ2_XXS, which llama.cpp refuses without an imatrix, with one in either form.
@pytest.mark.parametrize(("qtype", "matrix"), [("Q8_0", None), ("Q4_K_M", None), ("IQ4_NL", None),
                                               ("IQ2_XXS", "gguf"), ("IQ2_XXS", "legacy"), ("Q4_K_M", "legacy")])
def test_f16_same_bytes_as_llama_quantize(native_tools, wide, tmp_path, imatrix_gguf, imatrix_legacy, weights, qtype,
                                          matrix):
    path = {None: None, "gguf": str(imatrix_gguf), "legacy": str(imatrix_legacy)}[matrix]
    seen: list[tuple[int, int, str]] = []
    out = lp.quantize(wide, tmp_path / "ours.gguf", qtype, imatrix=path, threads=THREADS,
                      progress=lambda n, total, name: seen.append((n, total, name)))
    if path is not None:  # the same string for both: llama-quantize writes it into the file
        meta = read_gguf_info(out).metadata
        assert meta["quantize.imatrix.file"].value == path
        assert meta["quantize.imatrix.entries_count"].value == len(weights)
    ours = sha256(out)
    out.unlink()
    assert ours == reference(native_tools, wide, tmp_path / "ref.gguf", qtype, *(["--imatrix", path] if path else []))
    check_progress(seen, wide)
    assert leftovers(tmp_path) == []


def test_imatrix_is_used(wide, tmp_path, imatrix_gguf):
    with_matrix = sha256(lp.quantize(wide, tmp_path / "a.gguf", "Q4_K_M", imatrix=imatrix_gguf, quiet=True))
    assert with_matrix != sha256(lp.quantize(wide, tmp_path / "b.gguf", "Q4_K_M", quiet=True))


def test_cli_same_bytes_and_quiet(native_tools, smollm2_path, tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert main(["quantize", str(smollm2_path), str(out), "q8_0", "-t", str(THREADS), "--allow-requantize",
                 "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""  # --quiet: nothing on the terminal
    ours = sha256(out)
    out.unlink()
    assert ours == reference(native_tools, smollm2_path, tmp_path / "ref.gguf", "Q8_0", "--allow-requantize")


def test_cli_progress_bar(wide, tmp_path, capsys):
    n = len(read_gguf_info(wide).tensors)
    assert main(["quantize", str(wide), str(tmp_path / "out.gguf"), "Q8_0"]) == 0
    err = capsys.readouterr().err
    assert f"{n}/{n}" in err and "tensor" in err  # the bar, per tensor, up to the last one
    assert f"wrote {tmp_path / 'out.gguf'}" in err


def test_types_are_the_pins():
    # Every name llama-quantize lists (its usage text) is accepted, and nothing else.
    assert set(lp.QUANT_TYPES) >= {"Q4_K_M", "Q8_0", "IQ4_NL", "IQ2_XXS", "TQ1_0", "MXFP4_MOE", "F16", "BF16", "COPY"}
    from llamaplug.blocks.quantize import quant_type

    assert quant_type("q4_k") == ("Q4_K", quant_type("Q4_K_M")[1])
    assert quant_type(15)[0] == "Q4_K" and quant_type("7") == ("Q8_0", 7)


def test_usage_lists_the_same_types(native_tools):
    # llama-quantize's usage lists its types ("  15  or  Q4_K_M  : ..."): the same names, same numbers.
    run = subprocess.run([str(native_tools / "llama-quantize")], capture_output=True, text=True, timeout=60)
    listed = {}
    for line in run.stdout.splitlines():
        words = line.replace(":", " ").split()
        if len(words) >= 3 and words[0].isdigit() and words[1] == "or":
            listed[words[2]] = int(words[0])
        elif words and words[0] == "COPY":
            listed["COPY"] = 0
    assert listed == lp.QUANT_TYPES


@pytest.mark.parametrize("bad", ["Q9_K", "", "q4_k_xl", "99"])
def test_bad_type_lists_valid_ones(smollm2_path, tmp_path, bad):
    with pytest.raises(lp.InvalidParameterError, match="valid types: .*Q4_K_M") as info:
        lp.quantize(smollm2_path, tmp_path / "x.gguf", bad)
    assert info.value.field == "type"
    assert list(tmp_path.iterdir()) == []


def test_cli_bad_type(smollm2_path, tmp_path, capsys):
    assert main(["quantize", str(smollm2_path), str(tmp_path / "x.gguf"), "Q9", "-q"]) == 1
    err = capsys.readouterr().err
    assert "InvalidParameterError" in err and "Q4_K_M" in err and "Traceback" not in err


def test_unreadable_inputs(tmp_path, smollm2_path):
    with pytest.raises(lp.ModelNotFoundError, match="nope.gguf"):
        lp.quantize(tmp_path / "nope.gguf", tmp_path / "out.gguf", "Q8_0")
    text = tmp_path / "text.gguf"
    text.write_text("not a model")
    with pytest.raises(lp.InvalidModelError, match="not a GGUF"):
        lp.quantize(text, tmp_path / "out.gguf", "Q8_0")
    truncated = tmp_path / "truncated.gguf"
    with smollm2_path.open("rb") as fh:
        truncated.write_bytes(fh.read(4 << 20))
    with pytest.raises(lp.LlamaError, match="truncated.gguf"):
        lp.quantize(truncated, tmp_path / "out.gguf", "Q8_0", allow_requantize=True, quiet=True)
    with pytest.raises(lp.InvalidParameterError, match="does not exist"):
        lp.quantize(smollm2_path, tmp_path / "no" / "out.gguf", "Q8_0")
    with pytest.raises(lp.InvalidParameterError, match="input file"):
        lp.quantize(smollm2_path, smollm2_path, "Q8_0")
    assert not (tmp_path / "out.gguf").exists() and leftovers(tmp_path) == []


def test_refused_run_leaves_no_dst(smollm2_path, tmp_path):
    dst = tmp_path / "out.gguf"
    with pytest.raises(lp.QuantizeError, match="requantizing from type q4_1 is disabled.*allow_requantize"):
        lp.quantize(smollm2_path, dst, "Q8_0", quiet=True)
    assert not dst.exists() and leftovers(tmp_path) == []
    dst.write_bytes(b"old")  # a file already there stays as it was
    with pytest.raises(lp.QuantizeError, match="requires an imatrix.*imatrix=FILE"):
        lp.quantize(smollm2_path, dst, "IQ2_XXS", allow_requantize=True, quiet=True)
    assert dst.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_bad_imatrix(smollm2_path, tmp_path):
    with pytest.raises(lp.InvalidParameterError, match="imatrix .*missing.dat: no such file") as info:
        lp.quantize(smollm2_path, tmp_path / "out.gguf", "Q4_K_M", imatrix=tmp_path / "missing.dat")
    assert info.value.field == "imatrix"
    bare = tmp_path / "bare.imatrix.gguf"
    writer = gguf.GGUFWriter(str(bare), arch="imatrix")
    writer.add_tensor("blk.0.attn_q.weight.in_sum2", np.ones(576, dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight.counts", np.ones(1, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(lp.InvalidParameterError, match="missing imatrix metadata"):
        lp.quantize(smollm2_path, tmp_path / "out.gguf", "Q4_K_M", imatrix=bare)
    junk = tmp_path / "junk.dat"
    junk.write_bytes(b"\x02\x00\x00\x00\xff")
    with pytest.raises(lp.InvalidParameterError, match="truncated"):
        lp.quantize(smollm2_path, tmp_path / "out.gguf", "Q4_K_M", imatrix=junk)
    assert not (tmp_path / "out.gguf").exists()
