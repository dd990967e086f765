"""HFTokenizer: a `tokenizers.Tokenizer` standing in for a model's own tokenizer.

Tokenizing runs in the Rust `tokenizers` library (no Python loop over text or vocabulary);
detokenizing uses its decoder. Token pieces (the bytes of one token, for streaming) come
from the vocabulary strings, decoded as the tokenizer's family spells them, and streamed
text goes through an incremental UTF-8 decoder (as the core's TextAssembler without stop
sequences), which holds back a character split across tokens until it is complete.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from llamaplug.errors import InvalidParameterError, InvalidTokenError, TokenizerError, TokenizerMismatchError

SPACE = "\u2581"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
SAMPLE = 512  # vocabulary entries compared when a tokenizer is attached to a model (plus the special ones)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: a printable character for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_DECODER = _byte_decoder()


def load_tokenizer(source: str | os.PathLike[str]) -> Tokenizer:
    """A tokenizer.json file, or a folder holding one."""
    path = Path(source).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"no tokenizer.json at {path}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise TokenizerError(f"{path} is not a tokenizer.json the tokenizers library reads: {exc}") from None


class HFTokenizer:
    """The core's tokenizer protocol (tokenize / detokenize_bytes) over a `tokenizers.Tokenizer`."""

    def __init__(self, tokenizer: Tokenizer, name: str = "tokenizer"):
        if not isinstance(tokenizer, Tokenizer):
            raise TokenizerError(f"expected a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        self.name = name
        self.tokenizer = tokenizer  # as given (encode_special_tokens left as it was)
        text = tokenizer.to_str()
        # encode_special_tokens is a setting of the Tokenizer: one copy per mode, so no call changes state.
        self._plain = Tokenizer.from_str(text)
        self._plain.encode_special_tokens = True  # control-token text is plain text (special=False)
        self._special = Tokenizer.from_str(text)
        self._special.encode_special_tokens = False
        data = json.loads(text)
        model = data.get("model") or {}
        self.family = _family(model, data.get("decoder"))
        self.n_vocab = self._special.get_vocab_size(with_added_tokens=True)
        self._added = {int(t["id"]): (t["content"], bool(t.get("special"))) for t in data.get("added_tokens", [])}
        self._control = np.array(sorted(i for i, (_, sp) in self._added.items() if sp), dtype=np.int64)
        self._pieces: dict[int, bytes] = {}

    # -- the core's protocol ---------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise InvalidParameterError(f"text must be str, got {type(text).__name__}", field="text")
        # The batch call of one text: the same ids, without the character offsets encode() computes
        # (a third of the time on 1 MB).
        tok = self._special if special else self._plain
        return tok.encode_batch_fast([text], add_special_tokens=add_bos)[0].ids

    def detokenize(self, tokens: Iterable[int], special: bool = False) -> str:
        return self._special.decode(self._checked(tokens), skip_special_tokens=not special)

    def detokenize_bytes(self, tokens: Iterable[int], special: bool = False) -> bytes:
        return self.detokenize(tokens, special).encode("utf-8", "surrogatepass")

    # -- pieces and streaming --------------------------------------------------------
    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (part of a UTF-8 character for byte tokens); control tokens are b"" unless special."""
        added = self._added.get(token)
        if added is not None:
            text, is_special = added
            return text.encode() if special or not is_special else b""
        got = self._pieces.get(token)
        if got is None:
            got = self._pieces[token] = self._piece(token)
        return got

    def _piece(self, token: int) -> bytes:
        name = self._special.id_to_token(token)
        if name is None:
            if not 0 <= token < self.n_vocab:
                raise InvalidTokenError(f"token id {token} is outside {self.name} (0..{self.n_vocab - 1})",
                                        token=token)
            return b""
        if self.family == "byte_level":
            if all(c in _BYTE_DECODER for c in name):
                return bytes(_BYTE_DECODER[c] for c in name)
            # A character outside GPT-2's alphabet: what llama.cpp's llama_decode_text writes for it.
            return b"".join(bytes([_BYTE_DECODER[c]]) if c in _BYTE_DECODER else
                            b"[UNK_BYTE_0x" + c.encode().hex().encode() + name.encode() + b"]" for c in name)
        if self.family == "wordpiece":
            return name[2:].encode() if name.startswith("##") else b" " + name.encode()
        m = _BYTE_TOKEN.fullmatch(name)
        if m is not None:
            return bytes([int(m.group(1), 16)])
        return name.replace(SPACE, " ").encode()

    def stream(self, tokens: Iterable[int], special: bool = False) -> Iterator[str]:
        """Text as the tokens come: each yield is whole characters (a split character waits for its last byte)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for token in tokens:
            out = decoder.decode(self.piece(int(token), special))
            if out:
                yield out
        rest = decoder.decode(b"", final=True)
        if rest:
            yield rest

    # -- checks -----------------------------------------------------------------------
    def _checked(self, tokens: Iterable[int]) -> list[int]:
        arr = np.asarray(list(tokens) if not isinstance(tokens, np.ndarray) else tokens, dtype=np.int64).reshape(-1)
        bad = np.flatnonzero((arr < 0) | (arr >= self.n_vocab))
        if bad.size:
            token = int(arr[bad[0]])
            raise InvalidTokenError(f"token id {token} at position {int(bad[0])} is outside {self.name} "
                                    f"(0..{self.n_vocab - 1})", token=token)
        return arr.tolist()

    def check_against(self, model: Any) -> None:
        """Refuse a model whose vocabulary is not this tokenizer's: size, special tokens, a sample of pieces."""
        where = f"{self.name} and {model.path.name}"
        if self.n_vocab != model.n_vocab:
            raise TokenizerMismatchError(f"{where} differ in vocabulary size: {self.n_vocab} tokens vs "
                                         f"{model.n_vocab} in the model")
        specials = {i for i in (model.bos, model.eos, model.eot, model.nl) if i is not None}
        ids = sorted(specials | set(sample_ids(model.n_vocab)))
        differ = [i for i in ids if self.piece(i, special=True) != model.token_to_piece(i, special=True)]
        if differ:
            shown = ", ".join(f"{i} ({self.piece(i, True)!r} vs {model.token_to_piece(i, special=True)!r})"
                              for i in differ[:8])
            which = "special " if set(differ) & specials else ""
            raise TokenizerMismatchError(
                f"{where} differ at {len(differ)} of {len(ids)} {which}token ids compared: {shown}"
                + (" ..." if len(differ) > 8 else ""), ids=differ)


def sample_ids(n_vocab: int) -> list[int]:
    """The vocabulary entries compared on attach (besides the special tokens): SAMPLE ids spread evenly."""
    return sorted(set(np.linspace(0, n_vocab - 1, min(SAMPLE, n_vocab)).astype(int).tolist()))


def _family(model: dict[str, Any], decoder: Any) -> str:
    kind = model.get("type")
    if kind == "WordPiece":
        return "wordpiece"
    if kind == "BPE" and not model.get("byte_fallback") and "ByteLevel" in json.dumps(decoder):
        return "byte_level"
    if kind in ("BPE", "Unigram"):
        return "sentencepiece"
    raise TokenizerError(f"a tokenizers model of type {kind!r} is not supported (BPE, WordPiece, Unigram are)")
