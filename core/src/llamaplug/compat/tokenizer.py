"""llama-cpp-python's tokenizer surface: `Llama.tokenizer()` and the two vocabulary functions of its ctypes layer
that outlines' llama.cpp model calls to read the vocabulary (`llama_model_get_vocab`, `llama_token_to_piece`)."""

from __future__ import annotations

import ctypes
from typing import Any

from llamaplug import InvalidParameterError
from llamaplug.blocks.model import LlamaModel


class LlamaTokenizer:
    """llama_cpp.llama_tokenizer.LlamaTokenizer: tokens of one `Llama`, with its defaults (special tokens parsed)."""

    def __init__(self, llama: Any):
        self._llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._llama.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False) -> bytes:
        # As llama-cpp-python's: prev_tokens is taken and not used.
        return self._llama.detokenize(tokens, special=special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: list[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")


def llama_model_get_vocab(model: LlamaModel) -> LlamaModel:
    """The vocabulary of `Llama.model` (llamaplug's Model holds it): what llama_token_to_piece takes."""
    if not isinstance(model, LlamaModel):
        raise InvalidParameterError(f"llama_model_get_vocab takes Llama.model, got {type(model).__name__}",
                                    field="model")
    return model


def llama_token_to_piece(vocab: LlamaModel, token: int, buf: Any, length: int, lstrip: int, special: bool) -> int:
    """llama.cpp's llama_token_to_piece into a ctypes char buffer: the bytes written, or minus the size needed
    when `length` is too small (nothing written then)."""
    piece = llama_model_get_vocab(vocab).token_to_piece(token, special=bool(special), lstrip=lstrip)
    if length < 0 or length > ctypes.sizeof(buf):
        raise InvalidParameterError(f"length {length} is not within the buffer's {ctypes.sizeof(buf)} bytes",
                                    field="length")
    if len(piece) > length:
        return -len(piece)
    ctypes.memmove(buf, piece, len(piece))
    return len(piece)
