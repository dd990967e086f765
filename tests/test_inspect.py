"""`llamaplug inspect`: the project's GGUF reader against gguf-py's GGUFReader, on the real models.

Every key/value, every tensor (type, shape, bytes, offset) and the totals must be what an
independent reader finds; the CLI's --json document is the same data; a missing, truncated or
corrupted file is the LlamaError message with exit code 1, no traceback.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from fixtures import gguf_fuzz

gguf = pytest.importorskip("gguf", reason="gguf-py (tox installs it) is the independent reader")

from llamaplug.blocks.gguf_header import GGML_REMOVED_TYPES, GGML_TYPE_COUNT, GGML_TYPES  # noqa: E402
from llamaplug.blocks.gguf_info import ARRAY_HEAD, TOKEN_TYPES, read_gguf_info  # noqa: E402
from llamaplug.cli import main  # noqa: E402
from llamaplug.errors import LlamaError  # noqa: E402


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def model(request) -> Path:
    return request.getfixturevalue(f"{request.param}_path")


@pytest.fixture(scope="module")
def reader(model):
    return gguf.GGUFReader(model)


@pytest.fixture(scope="module")
def info(model):
    return read_gguf_info(model)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["inspect", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


# -- the type table ------------------------------------------------------------------------------


def test_type_sizes_match_gguf_py():
    both = [t for t in gguf.GGMLQuantizationType if t.value in GGML_TYPES]
    assert len(both) == len(gguf.GGMLQuantizationType), "gguf-py knows a type the core's table lacks"
    for t in both:
        name, block, type_size = GGML_TYPES[t.value]
        assert name == t.name
        assert (block, type_size) == gguf.GGML_QUANT_SIZES[t], t.name


def test_type_table_covers_the_pinned_ggml():
    assert set(GGML_TYPES) == set(range(GGML_TYPE_COUNT)) - GGML_REMOVED_TYPES


# -- the reader against GGUFReader ---------------------------------------------------------------


def test_file_fields(info, reader, model):
    assert info.path == model
    assert info.size == model.stat().st_size
    assert info.version == reader.fields["GGUF.version"].contents()
    assert info.alignment == reader.alignment
    assert info.data_offset == reader.data_offset


def test_same_keys_and_values(info, reader):
    fields = {name: f for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    assert list(info.metadata) == list(fields)
    for key, field in fields.items():
        value = info.metadata[key]
        assert value.type == field.types[0].name.lower(), key
        if value.type == "array":
            assert value.element_type == field.types[-1].name.lower(), key
            expected = field.contents()
            assert value.count == len(expected), key
            assert list(value.value) == expected, key
        else:
            assert value.value == field.contents(), key


def test_same_tensors(info, reader):
    assert len(info.tensors) == len(reader.tensors)
    for mine, theirs in zip(info.tensors, reader.tensors, strict=True):
        assert mine.name == theirs.name
        assert mine.type == theirs.tensor_type.name, mine.name
        assert mine.shape == tuple(int(d) for d in theirs.shape), mine.name
        assert mine.n_elements == theirs.n_elements, mine.name
        assert mine.n_bytes == theirs.n_bytes, mine.name
        assert mine.offset == theirs.data_offset, mine.name


def test_same_totals(info, reader):
    assert info.n_parameters == sum(t.n_elements for t in reader.tensors)
    assert info.n_bytes == sum(t.n_bytes for t in reader.tensors)
    by_type = info.by_type()
    for name, total in by_type.items():
        theirs = [t for t in reader.tensors if t.tensor_type.name == name]
        assert (total.tensors, total.parameters, total.bytes) == (
            len(theirs), sum(t.n_elements for t in theirs), sum(t.n_bytes for t in theirs))
    assert sum(t.tensors for t in by_type.values()) == len(reader.tensors)


def test_vocabulary(info, reader):
    vocab = info.vocabulary()
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert vocab.model == reader.fields["tokenizer.ggml.model"].contents()
    assert vocab.n_tokens == len(tokens)
    if "tokenizer.ggml.merges" in reader.fields:
        assert vocab.n_merges == len(reader.fields["tokenizer.ggml.merges"].contents())
    special = {k.removeprefix("tokenizer.ggml.").removesuffix("_token_id"): f.contents()
               for k, f in reader.fields.items() if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")}
    assert {name: tok.id for name, tok in vocab.special.items()} == special
    assert "bos" in special and "eos" in special
    for tok in vocab.special.values():
        assert tok.text == tokens[tok.id]
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    assert vocab.token_types == {TOKEN_TYPES[t]: types.count(t) for t in set(types)}
    assert sum(vocab.token_types.values()) == len(tokens)


def test_chat_templates(info, reader):
    expected = {("default" if k == "tokenizer.chat_template" else k.removeprefix("tokenizer.chat_template.")):
                f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.chat_template")}
    assert info.chat_templates() == expected


def test_smollm2_has_a_chat_template(smollm2_path):
    assert "<|im_start|>" in read_gguf_info(smollm2_path).chat_templates()["default"]


# -- the command ---------------------------------------------------------------------------------


def test_json_output(capsys, info, reader, model):
    code, out, err = cli(capsys, model, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc == json.loads(json.dumps(info.to_json()))
    assert doc["file"]["n_tensors"] == len(reader.tensors) == doc["totals"]["n_tensors"]
    assert [t["name"] for t in doc["tensors"]] == [t.name for t in reader.tensors]
    assert doc["totals"]["n_bytes"] == sum(t.n_bytes for t in reader.tensors)
    tokens = doc["metadata"]["tokenizer.ggml.tokens"]
    assert tokens["type"] == "array" and tokens["element_type"] == "string"
    assert tokens["count"] == len(reader.fields["tokenizer.ggml.tokens"].data)
    assert tokens["values"] == reader.fields["tokenizer.ggml.tokens"].contents()[:ARRAY_HEAD]
    assert doc["vocabulary"]["n_tokens"] == tokens["count"]


def test_json_all_gives_every_array_item(capsys, smollm2_path):
    code, out, _ = cli(capsys, smollm2_path, "--json", "--all")
    assert code == 0
    merges = json.loads(out)["metadata"]["tokenizer.ggml.merges"]
    assert merges["count"] == len(merges["values"]) > ARRAY_HEAD


def test_human_output(capsys, smollm2_path):
    info = read_gguf_info(smollm2_path)
    code, out, err = cli(capsys, smollm2_path)
    assert code == 0, err
    assert info.chat_templates()["default"] in out
    assert f"tensors ({len(info.tensors)}, {info.n_parameters:,} parameters" in out
    for section in ("file:", "metadata (", "tensors (", "vocabulary:", "chat template (default"):
        assert section in out
    assert f"{info.vocabulary().n_tokens:,} tokens" in out
    shown = [t.name for t in info.tensors if f"  {t.name} " in out]
    assert shown == [t.name for t in info.tensors[:32]]
    assert f"... {len(info.tensors) - 32} more" in out


def test_human_output_bounds(capsys, gemma_path):
    info = read_gguf_info(gemma_path)
    _, out, _ = cli(capsys, gemma_path, "--tensors", "3")
    assert f"... {len(info.tensors) - 3} more" in out
    assert "chat template: none" in out or "chat template (" in out
    _, out, _ = cli(capsys, gemma_path, "--all")
    assert all(f"  {t.name} " in out for t in info.tensors)
    assert "more (--tensors" not in out


# -- bad files -----------------------------------------------------------------------------------


def assert_refused(capsys, path: Path, exc_name: str, *fragments: str) -> str:
    for args in ((path,), (path, "--json")):
        code, out, err = cli(capsys, *args)
        assert code == 1
        assert out == ""
        assert err.startswith(f"llamaplug: {exc_name}: "), err
        assert "Traceback" not in err
        assert str(path) in err
        for fragment in fragments:
            assert fragment in err, err
    return err


def test_missing_file(capsys, tmp_path):
    err = assert_refused(capsys, tmp_path / "nope.gguf", "ModelNotFoundError", "model file not found")
    with pytest.raises(LlamaError) as raised:
        read_gguf_info(tmp_path / "nope.gguf")
    assert str(raised.value) in err  # the message loading gives


def test_not_a_gguf(capsys, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(100))
    assert_refused(capsys, bad, "InvalidModelError", "not a GGUF file")
    assert_refused(capsys, tmp_path, "InvalidModelError", "directory")


@pytest.fixture(scope="module")
def smollm2_sections(smollm2_path) -> dict[str, int]:
    reader = gguf.GGUFReader(smollm2_path)
    return {"kv_end": min(t.field.offset for t in reader.tensors), "data_start": reader.data_offset,
            "size": smollm2_path.stat().st_size}


def _cut(src: Path, dst: Path, at: int) -> Path:
    with src.open("rb") as fh:
        dst.write_bytes(fh.read(at))
    return dst


@pytest.mark.parametrize("where,fragment", [
    ("header", "truncated inside its header"),
    ("metadata", "failed to read key-value pairs"),
    ("tensor_infos", "failed to read tensor info"),
    ("tensor_data", "data is not within the file bounds"),
])
def test_truncated(capsys, tmp_path, smollm2_path, smollm2_sections, where, fragment):
    s = smollm2_sections
    at = {"header": 20, "metadata": s["kv_end"] // 2, "tensor_infos": (s["kv_end"] + s["data_start"]) // 2,
          "tensor_data": s["size"] - 1}[where]
    assert_refused(capsys, _cut(smollm2_path, tmp_path / f"cut_{where}.gguf", at), "InvalidModelError", fragment)


def test_corrupted_tensor_info(capsys, tmp_path):
    """A tensor whose offset is not where gguf.cpp expects it (the fuzzer's tensor-offset mutation)."""
    g = gguf_fuzz.tiny_base()
    g.tensors[1].offset += 32
    bad = tmp_path / "offset.gguf"
    bad.write_bytes(g.render().prefix + bytes(64))
    assert_refused(capsys, bad, "InvalidModelError", f"tensor '{g.tensors[1].name.decode()}' has offset")


def test_fuzzed_files_are_read_or_refused(tmp_path, smollm2_path):
    """The fuzzer's corrupted files: a GgufInfo or a LlamaError, nothing else (the reader is pure Python)."""
    outcomes = {"read": 0, "refused": 0}
    for i in range(150):
        case = gguf_fuzz.make_case(20240601, i, smollm2=smollm2_path)
        if case.size > 1 << 31:
            continue  # sparse files past 2 GiB: nothing new for the reader, slow on some file systems
        path = case.write(tmp_path / f"case{i}.gguf")
        try:
            got = read_gguf_info(path)
        except LlamaError:
            outcomes["refused"] += 1
        else:
            outcomes["read"] += 1
            assert got.n_parameters == sum(math.prod(t.shape) for t in got.tensors)
        path.unlink()
    assert outcomes["read"] and outcomes["refused"], outcomes


def test_the_quantization_is_named(capsys, model, reader):
    """gguf-py's LlamaFileType names the file type the CLI shows by llama.cpp's name (Q4_1, Q4_K - Medium)."""
    _, out, _ = cli(capsys, model)
    number = int(reader.fields["general.file_type"].contents())
    expected = gguf.LlamaFileType(number).name.removeprefix("MOSTLY_")  # Q4_1, Q4_K_M
    arch = reader.fields["general.architecture"].contents()
    line = next(line for line in out.splitlines() if line.startswith(f"  architecture {arch}, quantization "))
    named = line.split("quantization ", 1)[1].split(" (general.file_type")[0]
    assert named.replace(" - Medium", "_M").replace(" - Small", "_S") == expected
    assert line.endswith(f"(general.file_type {number})")
