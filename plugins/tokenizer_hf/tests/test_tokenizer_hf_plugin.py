"""The plugin on its own: registration, the GGUF header reader, pieces and errors (no model needed)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from llamaplug_tokenizer_hf import HFTokenizer, attach
from llamaplug_tokenizer_hf._gguf import read_tokenizer_kv
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

import llamaplug as lp
from llamaplug.plugins import tokenizer_factories


def test_registers_hf_through_the_hook() -> None:
    found = tokenizer_factories()["hf"]
    assert found.factory is attach and found.distribution == "llamaplug-tokenizer-hf"


def _byte_level() -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def test_byte_level_pieces_and_stream_hold_split_characters() -> None:
    hf = HFTokenizer(_byte_level())
    assert hf.family == "byte_level"
    ids = hf.tokenize("é🎉", add_bos=False)
    assert len(ids) == 6 and b"".join(hf.piece(i) for i in ids) == "é🎉".encode()
    assert list(hf.stream(ids)) == ["é", "🎉"]
    assert list(hf.stream(ids[:3])) == ["é", "\ufffd"]  # a cut character ends as U+FFFD, never as broken bytes
    assert hf.detokenize(ids) == "é🎉"
    with pytest.raises(lp.InvalidTokenError, match="outside"):
        hf.detokenize([len(ids) + 10_000])
    with pytest.raises(lp.InvalidParameterError):
        hf.tokenize(None)  # type: ignore[arg-type]


def test_not_a_tokenizer_is_refused() -> None:
    with pytest.raises(lp.TokenizerError, match="expected a tokenizers.Tokenizer"):
        HFTokenizer("tokenizer.json")  # type: ignore[arg-type]
    assert attach(42, None) is None  # not ours: the core asks the next plugin


def test_gguf_header_reader(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(lp.InvalidModelError, match="not a GGUF file"):
        read_tokenizer_kv(tmp_path / "x.gguf")
    key = b"tokenizer.ggml.model"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, 10)
    (tmp_path / "cut.gguf").write_bytes(data + b"gpt")
    with pytest.raises(lp.InvalidModelError, match="runs past the end"):
        read_tokenizer_kv(tmp_path / "cut.gguf")
    (tmp_path / "ok.gguf").write_bytes(data[:-8] + struct.pack("<Q", 4) + b"gpt2")
    assert read_tokenizer_kv(tmp_path / "ok.gguf") == {"tokenizer.ggml.model": b"gpt2"}
