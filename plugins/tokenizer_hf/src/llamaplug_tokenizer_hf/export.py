"""Build a `tokenizers.Tokenizer` from a GGUF's vocabulary that tokenizes exactly as llama.cpp does.

Supported (tokenizer.ggml.model): "gpt2" (byte-level BPE with the merges and the pre-tokenizer
regexes of `tokenizer.ggml.pre`, see _pre.py; also gemma4's SPM-style BPE), "llama" (SentencePiece
BPE: llama/mistral/phi-3/gemma; merges derived from the piece scores as llama.cpp merges them) and
"bert" (WordPiece). Everything else is an UnsupportedVocabError naming it.

The vocabulary is read from the GGUF header; which tokens are control/user-defined, the special
token ids and whether BOS/EOS are added come from llama.cpp itself (a vocab_only load), so the
exported file follows what llama.cpp resolved, not just what the GGUF says.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from llamaplug.errors import UnsupportedVocabError

from ._gguf import read_tokenizer_kv
from ._pre import PRE_TYPES, REFUSED, Pre

ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED = 1 << 0, 1 << 3, 1 << 4
ATTR_LSTRIP, ATTR_RSTRIP = 1 << 7, 1 << 8
SPACE = "\u2581"  # SentencePiece's visible space
HANGUL_TAG = "\u1b04"  # BALINESE SIGN BISAH: a spacing mark (Mc) of combining class 0, see _wpm


@dataclasses.dataclass
class VocabInfo:
    """What llama.cpp resolved for one vocabulary (a vocab_only load)."""

    kind: str  # tokenizer.ggml.model
    pre: str
    texts: list[str]
    scores: list[float] | None
    attrs: list[int]
    merges: list[str] | None
    bos: int | None
    eos: int | None
    unk: int | None
    sep: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    lowercase: bool


def read_vocab(path: str | os.PathLike[str]) -> VocabInfo:
    """The GGUF's vocabulary with llama.cpp's view of its special tokens."""
    import llamaplug as lp
    from llamaplug.raw import ffi, lib

    path = Path(path)
    kv = read_tokenizer_kv(path)
    kind = kv.get("tokenizer.ggml.model", b"").decode("utf-8", "replace")
    pre = kv.get("tokenizer.ggml.pre", b"").decode("utf-8", "replace")
    _check_supported(path, kind, pre)
    lp.LlamaBackend.init()
    with lp.LlamaModel(path, lp.ModelParams(vocab_only=True)) as model:
        vocab = model.vocab_handle()
        n = model.n_vocab
        attrs = [int(lib.llama_vocab_get_attr(vocab, i)) for i in range(n)]
        texts_c = [ffi.string(lib.llama_vocab_get_text(vocab, i)) for i in range(n)]

        def special(fn: Any) -> int | None:
            t = int(fn(vocab))
            return None if t == lib.LLAMA_TOKEN_NULL else t

        bos, eos = special(lib.llama_vocab_bos), special(lib.llama_vocab_eos)
        sep = special(lib.llama_vocab_sep)
        add_bos, add_eos = bool(lib.llama_vocab_get_add_bos(vocab)), bool(lib.llama_vocab_get_add_eos(vocab))
    texts = [t.decode("utf-8", "surrogateescape") for t in texts_c]
    unk = next((i for i, a in enumerate(attrs) if a & ATTR_UNKNOWN), None)
    scores = kv.get("tokenizer.ggml.scores")
    merges = kv.get("tokenizer.ggml.merges")
    if kind == "llama":
        default_prefix = True
    else:
        default_prefix = False
    return VocabInfo(
        kind=kind, pre=pre, texts=texts,
        scores=None if scores is None else [float(s) for s in scores],
        attrs=attrs,
        merges=None if merges is None else [m.decode("utf-8", "surrogateescape") for m in merges],
        bos=bos, eos=eos, unk=unk, sep=sep, add_bos=add_bos, add_eos=add_eos,
        add_space_prefix=bool(kv.get("tokenizer.ggml.add_space_prefix", default_prefix)),
        lowercase=bool(kv.get("tokenizer.ggml.normalizer.lowercase", True)),
    )


def _check_supported(path: Path, kind: str, pre: str) -> None:
    if kind == "gpt2":
        if pre in REFUSED:
            raise UnsupportedVocabError(f"{path.name}: pre-tokenizer {pre!r} cannot be exported: {REFUSED[pre]}",
                                        kind=f"gpt2/{pre}")
        if pre not in PRE_TYPES:
            raise UnsupportedVocabError(f"{path.name}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not one the "
                                        f"exporter knows; supported: {', '.join(sorted(p for p in PRE_TYPES if p))}",
                                        kind=f"gpt2/{pre}")
    elif kind not in ("llama", "bert", "gemma4"):
        raise UnsupportedVocabError(
            f"{path.name}: tokenizer model {kind!r} (tokenizer.ggml.model) cannot be exported; supported: "
            "gpt2 (byte-level BPE), gemma4 (SentencePiece-style BPE), llama (SentencePiece BPE), bert (WordPiece)",
            kind=kind)


def export(path: str | os.PathLike[str]) -> Tokenizer:
    """A `tokenizers.Tokenizer` that gives llama.cpp's tokens for the GGUF at `path`."""
    info = read_vocab(path)
    try:
        if info.kind in ("gpt2", "gemma4"):
            tok = _bpe(info, PRE_TYPES["gemma4" if info.kind == "gemma4" else info.pre])
        elif info.kind == "llama":
            tok = _spm(info)
        else:
            tok = _wpm(info)
        _add_special(tok, info)
    except UnsupportedVocabError:
        raise
    except Exception as exc:  # tokenizers raises plain Exceptions (e.g. a piece that is not valid UTF-8)
        raise UnsupportedVocabError(f"{Path(path).name}: the tokenizers library refused its vocabulary "
                                    f"({info.kind}/{info.pre}): {exc}", kind=info.kind) from None
    return tok


def export_json(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write the exported tokenizer of GGUF `path` to `out` (tokenizer.json); returns the path written."""
    out = Path(out)
    if out.is_dir():
        out = out / "tokenizer.json"
    if not out.parent.is_dir():
        from llamaplug.errors import InvalidParameterError

        raise InvalidParameterError(f"cannot write {out}: directory {out.parent} does not exist", field="output")
    tok = export(path)
    out.write_text(tok.to_str(pretty=False), encoding="utf-8")
    return out


# -- the three families ------------------------------------------------------------------


def _vocab_dict(texts: list[str]) -> dict[str, int]:
    # llama.cpp's token_to_id: a text that appears twice maps to its last id.
    return {t: i for i, t in enumerate(texts)}


def _bpe(info: VocabInfo, pre: Pre) -> Tokenizer:
    if info.merges is None:
        raise UnsupportedVocabError("the GGUF has no tokenizer.ggml.merges", kind="gpt2")
    vocab = _vocab_dict(info.texts)
    merges = []
    for line in info.merges:
        cut = line.find(" ", 1)
        if cut < 0:
            continue  # llama.cpp ranks it as ("", "") which never matches
        merges.append((line[:cut], line[cut + 1:]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges,
                               byte_fallback=not pre.byte_encode, fuse_unk=False))
    splits: list[Any] = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
    if pre.byte_encode:
        splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        tok.decoder = decoders.ByteLevel()
    else:
        tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    if pre.escape_whitespace:
        tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
    return tok


def _spm(info: VocabInfo) -> Tokenizer:
    """SentencePiece BPE as llama.cpp's llm_tokenizer_spm runs it.

    llama.cpp merges the adjacent pair whose concatenation is a token with the highest score
    (leftmost first on a tie). As BPE merges: every split of every token into two tokens,
    ranked by the whole token's score.
    """
    texts = info.texts
    scores = info.scores or [0.0] * len(texts)
    vocab = _vocab_dict(texts)
    ranked: list[tuple[float, int, int, str, str]] = []
    for text, tid in vocab.items():
        if len(text) < 2:
            continue
        for k in range(1, len(text)):
            a, b = text[:k], text[k:]
            if a in vocab and b in vocab:
                ranked.append((-scores[tid], tid, k, a, b))
    ranked.sort()
    merges = [(a, b) for _, _, _, a, b in ranked]
    unk = texts[info.unk] if info.unk is not None else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=False, unk_token=unk))
    steps: list[Any] = []
    if info.add_space_prefix:
        steps.append(normalizers.Prepend(SPACE))
    steps.append(normalizers.Replace(" ", SPACE))
    tok.normalizer = normalizers.Sequence(steps)
    dec: list[Any] = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if info.add_space_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(dec)
    return tok


def _wpm(info: VocabInfo) -> Tokenizer:
    """WordPiece: the GGUF spells word starts as U+2581 + piece and continuations bare (convert_hf_to_gguf)."""
    vocab: dict[str, int] = {}
    for i, text in enumerate(info.texts):
        if info.attrs[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN):
            name = text
        elif text.startswith(SPACE):
            name = text[1:]
        else:
            name = "##" + text
        vocab[name] = i
    unk = next((k for k, v in vocab.items() if v == info.unk), "[UNK]")
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token=unk, max_input_chars_per_word=1 << 30))
    # llama.cpp's WPM preprocess replaces each code point by the first one of its NFD (unicode_ranges_nfd),
    # then drops every \p{M} (not only Mn as BERT's strip_accents) and lowercases. NFD + dropping marks is
    # that, except for Hangul syllables, whose vowel and final jamo are letters: a syllable must become its
    # leading consonant alone. A mark (HANGUL_TAG, itself dropped) put after each syllable before the NFD
    # tells the syllable's own vowel and final from conjoining jamo that were in the text: one regex pass
    # instead of one per leading consonant (19 passes were 0.49 s of the 0.70 s normalizer on 1 MiB).
    # Tags already in the text go first; llama.cpp drops them anyway, and dropping a starter mark early
    # changes only other marks.
    steps: list[Any] = []
    if info.lowercase:
        steps += [normalizers.Replace(HANGUL_TAG, ""),
                  normalizers.Replace(Regex("[\uAC00-\uD7A3]\\K"), HANGUL_TAG),
                  normalizers.NFD(),
                  normalizers.Replace(Regex(f"[\u1161-\u1175][\u11A8-\u11C2]?{HANGUL_TAG}"), ""),
                  normalizers.Replace(Regex(r"\p{M}"), "")]
    steps.append(normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False,
                                            lowercase=info.lowercase))
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    return tok


def _add_special(tok: Tokenizer, info: VocabInfo) -> None:
    """Control/unknown tokens are special (parsed only with special=True); user-defined ones always are."""
    added = []
    for i, attr in enumerate(info.attrs):
        if attr & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN):
            text = info.texts[i]
            # llama.cpp parses control/unknown tokens only with parse_special (a token may be both).
            added.append(AddedToken(text, special=bool(attr & (ATTR_CONTROL | ATTR_UNKNOWN)), normalized=False,
                                    lstrip=bool(attr & ATTR_LSTRIP), rstrip=bool(attr & ATTR_RSTRIP)))
    if added:
        tok.add_tokens(added)
    single: list[Any] = []
    pairs: list[tuple[str, int]] = []

    def piece(i: int) -> str:
        name = info.texts[i]
        pairs.append((name, i))
        return name

    if info.kind == "bert":
        if info.bos is not None and info.sep is not None:
            single = [piece(info.bos), "$A", piece(info.sep)]
    else:
        single = ([piece(info.bos)] if info.add_bos and info.bos is not None else []) + ["$A"] + (
            [piece(info.eos)] if info.add_eos and info.eos is not None else [])
    if len(single) > 1:
        tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=list(dict.fromkeys(pairs)))


def summary(tok: Tokenizer) -> dict[str, Any]:
    """A short description of an exported tokenizer (model type, vocabulary size, added tokens)."""
    data = json.loads(tok.to_str())
    return {"model": data["model"]["type"], "vocab": tok.get_vocab_size(with_added_tokens=True),
            "added_tokens": len(data.get("added_tokens", []))}
