"""llamaplug-tokenizer-hf against llama.cpp itself: the exported tokenizer.json gives llama_tokenize's ids.

The reference is always llama.cpp (LlamaModel.tokenize on a vocab_only load, i.e. llama_tokenize),
on llama.cpp's own vocab vectors (models/ggml-vocab-*.gguf + .inp/.out) and on a multilingual
corpus of 2,700+ lines (tests/fixtures/tokenizer_corpus.py) for SmolLM2 (byte-level BPE,
pre "smollm"), Gemma-3 (SentencePiece, 262k pieces; optional package), and every ggml-vocab file
of the pinned tree. Then the plugin's side: LlamaParams(tokenizer=...), the vocabulary check,
streaming, the CLI, and the errors.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from fixtures import tokenizer_corpus
from llamaplug_testing import run_isolated
from llamaplug_testing.vocab_vectors import read_tests
from llamaplug_tokenizer_hf import HFTokenizer
from llamaplug_tokenizer_hf import _pre as pre_table
from llamaplug_tokenizer_hf.attached import sample_ids
from llamaplug_tokenizer_hf.export import HANGUL_TAG, export

import llamaplug as lp

# Every ggml-vocab file of the pin that ships .inp/.out vectors, and its family.
VECTOR_VOCABS = ("llama-spm", "phi-3", "llama-bpe", "gpt-2", "qwen2", "qwen35", "command-r", "deepseek-coder",
                 "deepseek-llm", "falcon", "mpt", "refact", "starcoder", "gemma-4", "bert-bge")
_EXPORTED: dict[Path, HFTokenizer] = {}


def exported(path: Path) -> HFTokenizer:
    if path not in _EXPORTED:
        _EXPORTED[path] = HFTokenizer(export(path), path.name)
    return _EXPORTED[path]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    lines = tokenizer_corpus.lines()
    assert len(lines) >= 2000
    return lines


def vocab(llama_cpp_dir: Path, name: str) -> Path:
    path = llama_cpp_dir / "models" / f"ggml-vocab-{name}.gguf"
    assert path.is_file(), f"{path} is missing from the pinned tree"
    return path


def compare(path: Path, lines: list[str], add_bos: bool = False, special: bool = False) -> tuple[int, list[str]]:
    """Tokens compared and the lines on which the exported tokenizer and llama.cpp differ."""
    hf = exported(path)
    lp.LlamaBackend.init()
    bad: list[str] = []
    n = 0
    with lp.LlamaModel(path, lp.ModelParams(vocab_only=True)) as model:
        for line in lines:
            ref = model.tokenize(line, add_bos=add_bos, special=special)
            got = hf.tokenize(line, add_bos=add_bos, special=special)
            n += len(ref)
            if got != ref:
                bad.append(f"{line[:60]!r}: {got[:12]} != llama.cpp {ref[:12]}")
    return n, bad


@pytest.mark.parametrize("name", VECTOR_VOCABS)
def test_exported_tokenizer_passes_llama_cpp_vectors(llama_cpp_dir: Path, name: str) -> None:
    path = vocab(llama_cpp_dir, name)
    tests, _, _ = read_tests(Path(f"{path}.inp"), Path(f"{path}.out"))
    assert len(tests) >= 40
    hf = exported(path)
    bad = [f"{src[:50]!r}" for src, ids in tests.items() if hf.tokenize(src.decode(), add_bos=False) != ids]
    assert not bad, f"{name}: {len(bad)} of {len(tests)} vectors differ: {bad[:10]}"


@pytest.mark.parametrize("name", VECTOR_VOCABS)
def test_exported_tokenizer_equals_llama_cpp_on_the_corpus(llama_cpp_dir: Path, corpus: list[str],
                                                           name: str) -> None:
    n, bad = compare(vocab(llama_cpp_dir, name), corpus)
    assert n > 10_000
    assert not bad, f"{name}: {len(bad)} of {len(corpus)} lines differ:\n" + "\n".join(bad[:10])


def test_smollm2_equals_llama_cpp_on_the_corpus(smollm2_path: Path, corpus: list[str]) -> None:
    n, bad = compare(smollm2_path, corpus)
    assert n > 40_000 and not bad, f"{len(bad)} of {len(corpus)} lines differ:\n" + "\n".join(bad[:10])
    whole = "\n".join(corpus)
    n, bad = compare(smollm2_path, [whole], add_bos=True)
    assert not bad


def test_gemma3_equals_llama_cpp_on_the_corpus(gemma_path: Path, corpus: list[str]) -> None:
    n, bad = compare(gemma_path, corpus)
    assert n > 30_000 and not bad, f"{len(bad)} of {len(corpus)} lines differ:\n" + "\n".join(bad[:10])
    n, bad = compare(gemma_path, ["\n".join(corpus)], add_bos=True)
    assert not bad


def test_wordpiece_hangul_and_its_tag_as_llama_cpp(llama_cpp_dir: Path) -> None:
    """The WPM normalizer tags each syllable to drop its own vowel and final jamo: conjoining jamo
    typed as such (NFD Korean, e.g. macOS file names), the tag character itself and marks around
    syllables must still come out as llama.cpp's."""
    nfd_korean = "\u1112\u1161\u11ab\u1100\u1173\u11af \u1109\u1165\u110b\u116e\u11af"
    lines = ["한국어 문장", nfd_korean, "가\u11a8 각\u1161 \u1100\u1161\u11a8", f"가{HANGUL_TAG}\u1161",
             f"\u1100{HANGUL_TAG}\u1161\u11a8", f"{HANGUL_TAG}ab{HANGUL_TAG}", "가\u0301나\u0903다", "ㄱㅏ 힣힢"]
    pool = ["가", "힣", "각", "\u1100", "\u1112", "\u1161", "\u1175", "\u11a8", "\u11c2", HANGUL_TAG, "\u0301",
            "\u0903", "\u3131", "a", "Z", " ", ".", "é"]
    rng = random.Random(15)
    lines += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 10))) for _ in range(3000)]
    n, bad = compare(vocab(llama_cpp_dir, "bert-bge"), lines)
    assert n > 3000
    assert not bad, f"{len(bad)} of {len(lines)} lines differ:\n" + "\n".join(bad[:10])


SPECIAL_LINES = ["<|im_start|>user\nHi<|im_end|>", "<s>[INST] x [/INST]</s>", "[CLS] a [SEP] b [MASK]",
                 "<start_of_turn>model\nok<end_of_turn>", "<|endoftext|> tail", "<unk><pad> <eos><bos>",
                 "plain text", ""]


@pytest.mark.parametrize("name", ["llama-spm", "llama-bpe", "qwen2", "phi-3", "bert-bge", "gemma-4", "smollm2"])
@pytest.mark.parametrize(("add_bos", "special"), [(True, False), (True, True), (False, True)])
def test_bos_eos_and_special_tokens_as_llama_cpp(llama_cpp_dir: Path, smollm2_path: Path, name: str, add_bos: bool,
                                                 special: bool) -> None:
    path = smollm2_path if name == "smollm2" else vocab(llama_cpp_dir, name)
    _, bad = compare(path, SPECIAL_LINES, add_bos=add_bos, special=special)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", ["llama-spm", "llama-bpe", "gpt-2", "qwen2", "gemma-4", "smollm2"])
def test_detokenize_round_trips_where_llama_cpp_does(llama_cpp_dir: Path, smollm2_path: Path, corpus: list[str],
                                                    name: str) -> None:
    path = smollm2_path if name == "smollm2" else vocab(llama_cpp_dir, name)
    hf = exported(path)
    with lp.LlamaModel(path, lp.ModelParams(vocab_only=True)) as model:
        theirs = [ln for ln in corpus if model.detokenize(model.tokenize(ln, add_bos=False)) == ln]
    assert len(theirs) > len(corpus) // 2
    broken = [ln for ln in theirs if hf.detokenize(hf.tokenize(ln, add_bos=False)) != ln]
    assert not broken, f"{len(broken)} of {len(theirs)} lines do not round-trip: {broken[:5]}"


@pytest.mark.parametrize("name", VECTOR_VOCABS)
def test_own_export_attaches_and_every_piece_is_llama_cpps(llama_cpp_dir: Path, name: str) -> None:
    """The vocabulary check passes for a GGUF's own export, and HFTokenizer.piece is token_to_piece.

    Every 4th id and every added (control/user-defined) token; all ids were compared once by hand (no difference).
    """
    path = vocab(llama_cpp_dir, name)
    with lp.LlamaModel(path, lp.ModelParams(vocab_only=True, tokenizer=exported(path).tokenizer)) as model:
        hf = model.tokenizer
        ids = sorted(set(range(0, model.n_vocab, 4)) | set(hf._added))
        bad = [i for i in ids if hf.piece(i, True) != model.token_to_piece(i, special=True)]
        assert not bad, f"{name}: {len(bad)} pieces differ, first ids {bad[:10]}"
        bad = [i for i in ids if hf.piece(i) != model.token_to_piece(i)]
        assert not bad, f"{name}: {len(bad)} pieces (special=False) differ, first ids {bad[:10]}"


def test_stream_never_splits_a_character(llama_cpp_dir: Path, smollm2_path: Path) -> None:
    text = "naïve café 日本語 🎉👩🏽\u200d💻 \U00012000\U00013000 ཀཁ"
    for path in (smollm2_path, vocab(llama_cpp_dir, "llama-spm")):
        hf = exported(path)
        tokens = hf.tokenize(text, add_bos=False)
        assert len(tokens) > len(text) // 2  # many characters span several byte tokens
        chunks = list(hf.stream(tokens))
        assert "".join(chunks).strip() == text
        assert all("\ufffd" not in c for c in chunks)
        with lp.LlamaModel(path, lp.ModelParams(vocab_only=True)) as model:
            assert b"".join(hf.piece(t) for t in tokens) == b"".join(model.token_to_piece(t) for t in tokens)


def test_params_tokenizer_makes_llama_use_it(smollm2_path: Path, tmp_path: Path) -> None:
    tok = export(smollm2_path)
    tok.save(str(tmp_path / "tokenizer.json"))
    text = "Hello <|im_start|> wörld 🎉"
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=256, n_threads=2,
                                      tokenizer=f"hf:{tmp_path / 'tokenizer.json'}")) as llama:
        assert isinstance(llama.model.tokenizer, HFTokenizer)
        ids = llama.tokenize(text, special=True)
        assert ids == llama.model.tokenizer.tokenize(text, True, True)
        assert llama.detokenize(ids, special=True) == text
        out = llama.create_completion("The capital of France is", max_tokens=4)
        assert out.prompt_tokens == llama.model.tokenizer.tokenize("The capital of France is")
    for spec in (f"hf:{tmp_path}", tok):  # a folder holding tokenizer.json; a tokenizers.Tokenizer
        with lp.LlamaModel(smollm2_path, lp.ModelParams(vocab_only=True, tokenizer=spec)) as model:
            assert isinstance(model.tokenizer, HFTokenizer)
            assert model.tokenize(text, special=True) == ids
    with lp.LlamaModel(smollm2_path, lp.ModelParams(vocab_only=True, tokenizer=tok)) as model:
        assert model.tokenize("x", add_bos=False) == tok.encode("x", add_special_tokens=False).ids
        with pytest.raises(lp.InvalidTokenError):
            model.detokenize([model.n_vocab])
        with pytest.raises(lp.InvalidParameterError):
            model.tokenize(b"bytes")  # type: ignore[arg-type]


def test_a_mismatching_vocabulary_is_refused_naming_the_ids(smollm2_path: Path, llama_cpp_dir: Path,
                                                            tmp_path: Path) -> None:
    with pytest.raises(lp.TokenizerMismatchError, match="vocabulary size: 50257 tokens vs 49152"):
        lp.LlamaModel(smollm2_path, lp.ModelParams(vocab_only=True, tokenizer=export(vocab(llama_cpp_dir, "gpt-2"))))
    data = json.loads(export(smollm2_path).to_str())
    pieces = data["model"]["vocab"]
    x, y = sample_ids(len(pieces))[100], sample_ids(len(pieces))[300]
    a, b = next(k for k, v in pieces.items() if v == x), next(k for k, v in pieces.items() if v == y)
    pieces[a], pieces[b] = y, x  # same size, two pieces swapped
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(lp.TokenizerMismatchError) as info:
        lp.LlamaModel(smollm2_path, lp.ModelParams(vocab_only=True, tokenizer=f"hf:{tmp_path}"))
    assert info.value.ids == [x, y]
    assert f"{x} (" in str(info.value) and f"{y} (" in str(info.value)


def test_bad_tokenizer_specs(smollm2_path: Path, tmp_path: Path) -> None:
    with pytest.raises(lp.TokenizerError, match="no tokenizer.json at"):
        lp.LlamaModel(smollm2_path, lp.ModelParams(vocab_only=True, tokenizer=f"hf:{tmp_path}"))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(lp.TokenizerError, match="is not a tokenizer.json"):
        lp.LlamaModel(smollm2_path, lp.ModelParams(vocab_only=True, tokenizer=f"hf:{tmp_path}"))
    with pytest.raises(lp.InvalidParameterError) as info:
        lp.ModelParams(tokenizer="tokenizer.json")
    assert info.value.field == "tokenizer"
    with pytest.raises(lp.TokenizerError, match="no tokenizer plugin takes a builtins.object"):
        lp.LlamaModel(smollm2_path, lp.ModelParams(vocab_only=True, tokenizer=object()))


def test_without_the_plugin_hf_is_an_error_naming_the_package(smollm2_path: Path) -> None:
    code = ("import llamaplug as lp; lp.LlamaBackend.init()\n"
            "try:\n"
            f"    lp.LlamaModel({str(smollm2_path)!r}, lp.ModelParams(vocab_only=True, tokenizer='hf:/x.json'))\n"
            "except lp.TokenizerError as e:\n    print('ERR', e)\n")
    env = {"LLAMAPLUG_PLUGINS": "backend_cpu"}  # every plugin but the CPU backend is left out
    done = run_isolated(code, env=env)
    assert "ERR" in done.stdout and "llamaplug-tokenizer-hf" in done.stdout, done.stdout + done.stderr


def test_cli_export_writes_a_tokenizer_json(llama_cpp_dir: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from llamaplug.cli import main

    path = vocab(llama_cpp_dir, "llama-spm")
    assert main(["tokenizer", "export", str(path), "-o", str(tmp_path / "t.json")]) == 0
    tok = Tokenizer.from_file(str(tmp_path / "t.json"))
    with lp.LlamaModel(path, lp.ModelParams(vocab_only=True)) as model:
        for line in ("Hello world", " leading", "日本語 🎉"):
            assert tok.encode(line).ids == model.tokenize(line)  # BOS as llama.cpp adds it
    assert main(["tokenizer", "export", str(tmp_path / "missing.gguf"), "-o", str(tmp_path)]) == 1


def _tiny_vocab_gguf(path: Path, model: str, pre: str | None = None) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(["<unk>", "a", "b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


REFUSED = [("t5", None, "'t5'"), ("rwkv", None, "'rwkv'"), ("plamo2", None, "'plamo2'"),
           ("gpt2", "kimi-k2", "'kimi-k2'"), ("gpt2", "afmoe", "'afmoe'"), ("gpt2", "no-such-pre", "'no-such-pre'")]


@pytest.mark.parametrize(("model", "pre", "named"), REFUSED)
def test_unsupported_vocabularies_are_refused_by_name(tmp_path: Path, model: str, pre: str | None, named: str) -> None:
    path = _tiny_vocab_gguf(tmp_path / "v.gguf", model, pre)
    with pytest.raises(lp.UnsupportedVocabError, match=re.escape(named)):
        export(path)


def test_pre_tokenizer_table_is_the_pinned_llama_cpp(llama_cpp_dir: Path) -> None:
    """Every regex list in _pre.py is, byte for byte, the one llama-vocab.cpp of the pin uses."""
    src = (llama_cpp_dir / "src" / "llama-vocab.cpp").read_text(encoding="utf-8")

    def literals(case: str) -> tuple[str, ...]:
        start = src.index(case)
        block = src[start:src.index("break;", start)]
        found = re.findall(r'^\s*"((?:[^"\\]|\\.)*)",?\s*(?://.*)?$', block, re.M)
        return tuple(s.encode("utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8") for s in found)

    cases = {"LLAMA3": "LLAMA3", "QWEN2": "QWEN2", "QWEN35": "QWEN35", "GPT2": "GPT2", "STARCODER": "STARCODER",
             "FALCON": "FALCON", "SEED_CODER": "SEED_CODER", "LINES": "GEMMA4", "DEEPSEEK_LLM": "DEEPSEEK_LLM",
             "DEEPSEEK_CODER": "DEEPSEEK_CODER", "BLOOM": "PORO", "VIKING": "VIKING"}
    for name, case in cases.items():
        assert getattr(pre_table, name) == literals(f"case LLAMA_VOCAB_PRE_TYPE_{case}:"), name
    assert pre_table.DEFAULT == literals("default:\n                // default regex")
