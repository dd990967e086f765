"""Tokenizing a long text in pieces, with the tokens llama.cpp gives for the whole text, in time linear in its length.

llama.cpp splits a text at its special tokens' texts before it tokenizes (llama-vocab.cpp,
tokenizer_st_partition), and each split walks its list of pieces from the start to find its
place again: a text with N special-token texts costs N² steps. A long chat's prompt has a
few per message (10,000 messages took 5.8 s, 30,000 turns 43 s, in llama-server too).
Cut where llama.cpp's own partition cuts, each piece is tokenized as it would be in the
whole text, and the work can stop between pieces (`cancellation.checkpoint`).

Where the cuts are exact: llama.cpp takes the special tokens longest first, each over the
whole text left of the ones before it, leftmost first, and tokenizes each piece between them
on its own. So before each (leftmost, non-overlapping) occurrence of `S`, the longest special
text the text holds, is a cut of the whole text's partition too, provided no other special
text at least as long occurs (its order against `S` is not fixed: llama.cpp's sort is not
stable) and `S` does not strip the whitespace on its left (LSTRIP: that whitespace lies in the
piece before). A piece after the first starts with `S`, so no state carries over a cut (SPM's
space prefix follows a special token either way). BOS is the first piece's; a vocabulary
that adds a token at the end (EOS, WPM's SEP) is tokenized whole.
"""

from __future__ import annotations

from typing import Any

from ..raw import ffi, lib
from .cancellation import checkpoint

# Shorter texts go whole: few special texts fit in them, and the search costs more than it saves.
MIN_BYTES = 64 * 1024
# A piece ends at the first cut past this size or after this many cuts, whichever comes first: llama.cpp's
# cost in a piece grows with the square of its special texts.
PIECE_BYTES = 32 * 1024
PIECE_CUTS = 128

_SPECIAL = 1 << 0 | 1 << 3 | 1 << 4  # LLAMA_TOKEN_ATTR_UNKNOWN | CONTROL | USER_DEFINED: what llama.cpp splits at
_PARSED_ONLY = 1 << 0 | 1 << 3  # UNKNOWN | CONTROL: split at only when special text is parsed
_LSTRIP = 1 << 7


def special_texts(vocab: Any, n_vocab: int) -> list[tuple[bytes, int]]:
    """(text, attributes) of each token llama.cpp splits a text at, longest first."""
    out = []
    for token in range(n_vocab):
        attr = int(lib.llama_vocab_get_attr(vocab, token))
        if attr & _SPECIAL:
            out.append((ffi.string(lib.llama_vocab_get_text(vocab, token)), attr))
    out.sort(key=lambda item: -len(item[0]))
    return out


def whole_only(vocab: Any, add_special: bool) -> bool:
    """Whether texts must be tokenized whole: add_special with a vocabulary that adds a token at the end."""
    if not add_special:
        return False
    kind = int(lib.llama_vocab_type(vocab))
    if kind in (lib.LLAMA_VOCAB_TYPE_RWKV, lib.LLAMA_VOCAB_TYPE_PLAMO2):
        return False  # they add nothing
    if kind in (lib.LLAMA_VOCAB_TYPE_SPM, lib.LLAMA_VOCAB_TYPE_BPE, lib.LLAMA_VOCAB_TYPE_UGM):
        return bool(lib.llama_vocab_get_add_eos(vocab))
    return True  # WPM (SEP at the end) and any kind not known here


def cuts(data: bytes, specials: list[tuple[bytes, int]], parse_special: bool) -> list[int]:
    """Byte offsets where `data` may be cut (see the module's docstring); [] where it may not."""
    chosen: bytes | None = None
    for text, attr in specials:
        if not parse_special and attr & _PARSED_ONLY:
            continue
        if chosen is not None and len(text) < len(chosen):
            break
        if not text:
            return []  # llama.cpp's search would find it anywhere: not a text to reason about here
        if text in data:
            if chosen is not None or attr & _LSTRIP:
                return []  # two as long (their order is not fixed), or one that strips the piece before it
            chosen = text
    if chosen is None:
        return []
    found, at, size = [], data.find(chosen), len(chosen)
    while at >= 0:
        found.append(at)
        at = data.find(chosen, at + size)
    return found


def pieces(data: bytes, offsets: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each piece: cut at `offsets`, each piece at least PIECE_BYTES or PIECE_CUTS cuts long."""
    out: list[tuple[int, int]] = []
    start, n = 0, 0
    for at in offsets:
        if at > start and (at - start >= PIECE_BYTES or n >= PIECE_CUTS):
            out.append((start, at))
            start, n = at, 0
        n += 1
    out.append((start, len(data)))
    return out


def tokenize_pieces(tokenize: Any, data: bytes, offsets: list[int], add_special: bool) -> list[int]:
    """`tokenize(piece, add_special)` of each piece, joined; the work may stop between pieces."""
    tokens: list[int] = []
    for i, (start, end) in enumerate(pieces(data, offsets)):
        checkpoint()
        tokens += tokenize(data[start:end], add_special and i == 0)
    checkpoint()
    return tokens
