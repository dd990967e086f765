"""LlamaModel: weights, vocabulary and metadata of one GGUF file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    BackendNotInitialisedError,
    InvalidModelError,
    InvalidParameterError,
    InvalidTokenError,
    LoadCancelledError,
    check_ptr,
    native_error,
)
from ..params import ContextParams, ModelParams, SamplerParams
from ..plugins import pm
from ..raw import ffi, lib
from . import _callback_errors, _native_log, fitting, long_text
from ._handle import NativeHandle
from ._text import encode_text, read_string
from .backend import LlamaBackend
from .c_params import model_c_params
from .fitting import FitResult
from .gguf_header import TENSOR_ALIGNMENT, inspect_model
from .sampling import SamplerChain
from .tokenizer import attach as attach_tokenizer

# llama_vocab_<name> for each special token a vocabulary may have (llama.h).
SPECIAL_TOKENS = ("bos", "eos", "eot", "sep", "nl", "pad", "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep",
                  "fim_sep")


class LlamaModel(NativeHandle):
    """A loaded model. Outlives its contexts: closing it closes them first."""

    _what = "model"

    @classmethod
    def load(cls, path: str | os.PathLike[str], params: ModelParams | None = None) -> LlamaModel:
        """Initialise the backend if needed (as Llama.load does) and load `path` (seed 004's Model::load)."""
        LlamaBackend.init()
        return cls(path, params)

    def __init__(self, path: str | os.PathLike[str], params: ModelParams | None = None,
                 context: ContextParams | None = None):
        """Load `path`. With n_gpu_layers="auto", `context` is the context the fit makes room for."""
        if not LlamaBackend.initialised():
            raise BackendNotInitialisedError(
                "call LlamaBackend.init() before loading a model (Llama.load does it for you)"
            )
        header = inspect_model(path)
        self.path = header.path
        self.params = params or ModelParams()
        c_params, keep_alive = model_c_params(self.params)
        if not header.mmap_aligned and c_params.load_mode in (-1, 1, 3):  # AUTO, MMAP, MMAP_MLOCK
            # llama.cpp's file-path loader mmaps tensor data at any file offset and then aborts in
            # ggml_backend_cpu_buffer_from_ptr (GGML_ASSERT "buffer pointer must be aligned"); only its
            # file-pointer loader checks. Without mmap the data is copied into aligned buffers.
            if self.params.use_mmap is not None:
                raise InvalidModelError(
                    f"cannot mmap {self.path}: its tensor data starts at file offset {header.data_offset}, "
                    f"not a multiple of {TENSOR_ALIGNMENT} bytes; load it with use_mmap=False")
            c_params.load_mode = 2 if self.params.use_mlock else 0  # MLOCK / NONE: auto means no mmap here
        self.fit: FitResult | None = None
        context = context or ContextParams()
        if fitting.wanted(self.params, context):
            self.fit, buffers = fitting.fit(str(self.path), c_params, context, self.params.fit_target_mib,
                                            self.params.fit_min_ctx)
            keep_alive += buffers
        progress = _Progress(self.params.progress_callback) if self.params.progress_callback else None
        if progress is not None:
            keep_alive.append(progress.attach(c_params))
        with _native_log.capture_errors() as errors:
            ptr = lib.llama_model_load_from_file(str(self.path).encode(), c_params)
        del keep_alive
        _callback_errors.raise_stored()  # the progress callback's own exception, if it raised
        if not ptr and progress is not None and progress.cancelled:
            raise LoadCancelledError(f"loading {self.path} was cancelled by the progress callback "
                                     f"at {progress.last:.0%}")
        check_ptr(ptr, InvalidModelError, f"llama.cpp could not load {self.path}", errors)
        self._adopt(ptr, lib.llama_model_free)
        self._vocab = lib.llama_model_get_vocab(ptr)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self._vocab_problems = _vocab_problems(self._vocab, self.path)
        # Per-token answers that never change for a loaded vocabulary, asked once per generated
        # token: a dict hit costs less than the C call, its buffer and the checks.
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._eog_tokens: tuple[int, ...] | None = None
        self._special_texts: list[tuple[bytes, int]] | None = None  # for long texts (long_text.py), on first use
        self._byte_gaps = header.byte_gaps if int(lib.llama_vocab_type(self._vocab)) == lib.LLAMA_VOCAB_TYPE_SPM \
            else None
        self._tokenizer: Any = None
        if self.params.tokenizer is not None:
            try:
                self._tokenizer = attach_tokenizer(self.params.tokenizer, self)
            except BaseException:
                self.close()
                raise
        pm.hook.llamaplug_model_loaded(model=self)

    # -- tokens ------------------------------------------------------------
    def check_token(self, token: int) -> int:
        if not 0 <= token < self.n_vocab:
            raise InvalidTokenError(f"token id {token} is outside the vocabulary (0..{self.n_vocab - 1})", token=token)
        return token

    def check_tokens(self, tokens: Any) -> np.ndarray:
        """Tokens as an int32 array, each checked against the vocabulary (vectorised)."""
        try:
            arr = np.asarray(tokens, dtype=np.int64).reshape(-1)
        except (OverflowError, ValueError, TypeError):
            # Only on this error path: find the first entry that is not a 64-bit integer, to name it.
            for i, t in enumerate(list(tokens) if isinstance(tokens, (list, tuple)) else [tokens]):
                if not isinstance(t, (int, np.integer)) or not -2**63 <= int(t) < 2**63:
                    raise InvalidTokenError(f"token {i} ({str(t)[:40]}) is not a token id (0..{self.n_vocab - 1})",
                                            token=None) from None
            raise InvalidTokenError(f"tokens must be a flat list of token ids (0..{self.n_vocab - 1})") from None
        if arr.size:
            bad = np.flatnonzero((arr < 0) | (arr >= self.n_vocab))
            if bad.size:
                token = int(arr[bad[0]])
                raise InvalidTokenError(
                    f"token id {token} at position {int(bad[0])} is outside the vocabulary (0..{self.n_vocab - 1})",
                    token=token,
                )
        return arr.astype(np.int32)

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text`; `special=True` parses control-token text like "<|im_start|>"."""
        data = encode_text(text)
        if self._tokenizer is not None:
            self._ptr  # noqa: B018 - raises ClosedError once closed
            return self._tokenizer.tokenize(text, add_bos, special)
        self._check_vocab(add_bos)
        if self._byte_gaps is not None:
            ch = self._byte_gaps.unencodable(text)
            if ch is not None:
                raise InvalidParameterError(
                    f"{self.path.name}'s vocabulary can spell neither {ch!r} nor its bytes "
                    "(llama.cpp would abort the process)", field="text")
        if len(data) >= long_text.MIN_BYTES and not long_text.whole_only(self._vocab, add_bos):
            # llama.cpp's cost grows with the square of the special texts in one call (long_text.py)
            if self._special_texts is None:
                self._special_texts = long_text.special_texts(self._vocab, self.n_vocab)
            offsets = long_text.cuts(data, self._special_texts, special)
            if offsets:
                return long_text.tokenize_pieces(lambda piece, add: self._tokenize(piece, add, special), data,
                                                 offsets, add_bos)
        return self._tokenize(data, add_bos, special)

    def _tokenize(self, data: bytes, add_bos: bool, special: bool) -> list[int]:
        n_max = len(data) + 2 * int(add_bos) + 1
        buf = ffi.new("llama_token[]", n_max)
        n = lib.llama_tokenize(self._vocab_ptr, data, len(data), buf, n_max, add_bos, special)
        if n < 0:  # the buffer estimate was short (some vocabularies add more than BOS)
            n_max = -n
            buf = ffi.new("llama_token[]", n_max)
            n = lib.llama_tokenize(self._vocab_ptr, data, len(data), buf, n_max, add_bos, special)
        if n < 0:
            raise native_error(InvalidParameterError, f"tokenization failed for {len(data)} bytes of text",
                               field="text")
        return ffi.unpack(buf, n)

    def detokenize(self, tokens: Any, special: bool = False) -> str:
        """Text of `tokens`; `special=True` renders control tokens as their text."""
        return self.detokenize_bytes(tokens, special).decode("utf-8", "replace")

    def detokenize_bytes(self, tokens: Any, special: bool = False) -> bytes:
        arr = self.check_tokens(tokens)
        if self._tokenizer is not None:
            self._ptr  # noqa: B018 - raises ClosedError once closed
            return self._tokenizer.detokenize_bytes(arr.tolist(), special)
        self._check_vocab(False)
        if not arr.size:
            return b""
        c_tokens = ffi.from_buffer("llama_token[]", arr)
        size = max(64, arr.size * 8)
        for _ in range(2):
            buf = ffi.new("char[]", size)
            n = lib.llama_detokenize(self._vocab_ptr, c_tokens, arr.size, buf, size, False, special)
            if n >= 0:
                return ffi.unpack(buf, n)
            size = -n
        raise native_error(InvalidParameterError, "detokenization failed", field="tokens")

    @property
    def tokenizer(self) -> Any:
        """The external tokenizer that tokenizes and detokenizes for this model (ModelParams.tokenizer), or None."""
        return self._tokenizer

    def token_to_piece(self, token: int, special: bool = False, lstrip: int = 0) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character); `lstrip` leading spaces dropped."""
        plain = not special and not lstrip
        if plain and self._raw is not None:
            piece = self._pieces.get(token)
            if piece is not None:
                return piece
        self.check_token(token)
        if not 0 <= lstrip <= 0x7FFFFFFF:
            raise InvalidParameterError(f"lstrip must be a count of spaces >= 0, got {lstrip}", field="lstrip")
        self._check_vocab(False)
        buf = ffi.new("char[]", 64)
        n = lib.llama_token_to_piece(self._vocab_ptr, token, buf, 64, lstrip, special)
        if n < 0:
            buf = ffi.new("char[]", -n)
            n = lib.llama_token_to_piece(self._vocab_ptr, token, buf, -n, lstrip, special)
        piece = ffi.unpack(buf, n)
        if plain:
            self._pieces[token] = piece
        return piece

    def token_to_str(self, token: int, lstrip: int = 0, special: bool = False) -> str:
        """Text of one token (seed 004's argument order: token, lstrip, special); a partial character is U+FFFD."""
        return self.token_to_piece(token, special, lstrip).decode("utf-8", "replace")

    def token_is_eog(self, token: int) -> bool:
        if self._raw is not None:
            eog = self._eog.get(token)
            if eog is not None:
                return eog
        eog = self._eog[token] = bool(lib.llama_vocab_is_eog(self._vocab_ptr, self.check_token(token)))
        return eog

    @property
    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token id of the vocabulary, read once per model (llama-server's logit_bias_eog,
        what a request's ignore_eos bans)."""
        if self._eog_tokens is None:
            vocab = self._vocab_ptr
            self._eog_tokens = tuple(t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(vocab, t))
        return self._eog_tokens

    def token_is_control(self, token: int) -> bool:
        return bool(lib.llama_vocab_is_control(self._vocab_ptr, self.check_token(token)))

    def _check_vocab(self, add_special: bool) -> None:
        """Refuse what llama.cpp would abort on: text ops without a tokenizer, special tokens it lacks."""
        self._ptr  # noqa: B018 - raises ClosedError once closed
        no_tokenizer, no_special = self._vocab_problems
        if no_tokenizer or (add_special and no_special):
            raise InvalidModelError(no_tokenizer or no_special)

    @property
    def _vocab_ptr(self) -> Any:
        self._ptr  # noqa: B018 - raises ClosedError once closed
        return self._vocab

    def vocab_handle(self) -> Any:
        """The `llama_vocab *`, for a plugin's own C calls (valid while this model is open)."""
        return self._vocab_ptr

    def special_token(self, name: str) -> int | None:
        """The vocabulary's `name` token (one of SPECIAL_TOKENS: "bos", "sep", "fim_pre", ...), None if it has none."""
        if name not in SPECIAL_TOKENS:
            raise InvalidParameterError(f"no special token {name!r}; llama.cpp names {', '.join(SPECIAL_TOKENS)}",
                                        field="name")
        token = int(getattr(lib, f"llama_vocab_{name}")(self._vocab_ptr))
        return None if token == lib.LLAMA_TOKEN_NULL else token

    @property
    def bos(self) -> int | None:
        return self.special_token("bos")

    @property
    def eos(self) -> int | None:
        return self.special_token("eos")

    @property
    def eot(self) -> int | None:
        return self.special_token("eot")

    @property
    def sep(self) -> int | None:
        return self.special_token("sep")

    @property
    def nl(self) -> int | None:
        return self.special_token("nl")

    @property
    def add_bos(self) -> bool:
        return bool(lib.llama_vocab_get_add_bos(self._vocab_ptr))

    @property
    def add_eos(self) -> bool:
        return bool(lib.llama_vocab_get_add_eos(self._vocab_ptr))

    @property
    def add_sep(self) -> bool:
        return bool(lib.llama_vocab_get_add_sep(self._vocab_ptr))

    @property
    def vocab_type(self) -> int:
        return int(lib.llama_vocab_type(self._vocab_ptr))

    # -- shape and metadata -----------------------------------------------
    @property
    def n_ctx_train(self) -> int:
        return int(lib.llama_model_n_ctx_train(self._ptr))

    def n_ctx_for(self, n_ctx: int) -> int:
        """The window a context made with `n_ctx` asks for: n_ctx, or for 0 the training context (llama.cpp's rule).

        The one place that reads ContextParams.n_ctx=0; a fit (n_gpu_layers="auto") may pick a smaller one first.
        """
        return n_ctx or self.n_ctx_train

    @property
    def n_embd(self) -> int:
        return int(lib.llama_model_n_embd(self._ptr))

    @property
    def n_embd_out(self) -> int:
        """Values of one output embedding (n_embd for most models)."""
        return int(lib.llama_model_n_embd_out(self._ptr))

    @property
    def n_cls_out(self) -> int:
        """Scores a classifier head gives per sequence (rank pooling: a reranker's relevance first)."""
        return int(lib.llama_model_n_cls_out(self._ptr))

    @property
    def has_encoder(self) -> bool:
        return bool(lib.llama_model_has_encoder(self._ptr))

    @property
    def has_decoder(self) -> bool:
        return bool(lib.llama_model_has_decoder(self._ptr))

    @property
    def n_swa(self) -> int:
        """The sliding attention window (0: every layer sees the whole context)."""
        return int(lib.llama_model_n_swa(self._ptr))

    @property
    def n_layer(self) -> int:
        return int(lib.llama_model_n_layer(self._ptr))

    @property
    def n_head(self) -> int:
        # llama.cpp reads layer 0's count, and aborts where no layer was loaded (vocab_only): none then.
        return int(lib.llama_model_n_head(self._ptr)) if self.n_layer else 0

    @property
    def n_params(self) -> int:
        return int(lib.llama_model_n_params(self._ptr))

    @property
    def size(self) -> int:
        """Bytes of all weight tensors."""
        return int(lib.llama_model_size(self._ptr))

    @property
    def desc(self) -> str:
        return read_string(lambda buf, n: lib.llama_model_desc(self._ptr, buf, n))

    @property
    def chat_template(self) -> str | None:
        """The GGUF's chat template (tokenizer.chat_template), None where it has none."""
        return self.named_chat_template(None)

    def named_chat_template(self, name: str | None) -> str | None:
        """The GGUF's template `name` (tokenizer.chat_template.<name>, e.g. "rerank"), None where it has none."""
        ptr = lib.llama_model_chat_template(self._ptr, ffi.NULL if name is None else encode_text(name, "name"))
        return None if ptr == ffi.NULL else ffi.string(ptr).decode("utf-8", "replace")

    def sampler_chain(self, params: SamplerParams) -> SamplerChain:
        """llama.cpp's common sampler chain for `params`, built for this vocabulary (SamplerParams.build_chain)."""
        return SamplerChain.from_params(params, self)

    @property
    def metadata(self) -> dict[str, str]:
        """GGUF metadata as strings (arrays are summarised by llama.cpp)."""
        ptr = self._ptr
        out = {}
        for i in range(lib.llama_model_meta_count(ptr)):
            key = read_string(lambda buf, n, i=i: lib.llama_model_meta_key_by_index(ptr, i, buf, n))
            out[key] = read_string(lambda buf, n, i=i: lib.llama_model_meta_val_str_by_index(ptr, i, buf, n))
        return out

    def save(self, path: str | os.PathLike[str]) -> Path:
        target = Path(path)
        if not target.parent.is_dir():
            raise InvalidParameterError(f"cannot save model: directory {target.parent} does not exist", field="path")
        with _native_log.capture_errors() as errors:
            lib.llama_model_save_to_file(self._ptr, str(target).encode())
        if not target.is_file():
            raise native_error(InvalidModelError, f"llama.cpp did not write {target}", errors)
        return target

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.desc
        return f"<LlamaModel {self.path.name} {state}>"


class _Progress:
    """A model-load progress callback: the user's function, and whether it asked to stop."""

    def __init__(self, fn: Any):
        self.fn, self.cancelled, self.last = fn, False, 0.0

    def attach(self, c_params: Any) -> Any:
        handle = ffi.new_handle(self)
        c_params.progress_callback = lib._llamaplug_progress_cb
        c_params.progress_callback_user_data = handle
        return handle


@ffi.def_extern(onerror=_callback_errors.store)  # an exception stops the load (returns false) and is raised after
def _llamaplug_progress_cb(progress, user_data):
    state = ffi.from_handle(user_data)
    state.last = float(progress)
    if state.fn(state.last) is False:
        state.cancelled = True
        return False
    return True


def _vocab_problems(vocab: Any, path: Path) -> tuple[str | None, str | None]:
    """(why no text op works, why special tokens cannot be added): llama-vocab.cpp GGML_ASSERTs on both.

    A model whose tokenizer is "none"/"no_vocab" has no tokenizer object (tokenize asserts, token_to_piece
    aborts); tokenizing with add_special asserts that the BOS/EOS/SEP tokens the vocabulary adds exist.
    """
    kind = int(lib.llama_vocab_type(vocab))
    if kind == lib.LLAMA_VOCAB_TYPE_NONE:
        return f"{path.name} has no tokenizer (tokenizer.ggml.model none): it cannot tokenize or detokenize", None
    null = lib.LLAMA_TOKEN_NULL
    missing = []
    if kind == lib.LLAMA_VOCAB_TYPE_WPM:
        needed = [("BOS", lib.llama_vocab_bos(vocab)), ("SEP", lib.llama_vocab_sep(vocab))]
    else:
        needed = []
        if lib.llama_vocab_get_add_bos(vocab):
            needed.append(("BOS", lib.llama_vocab_bos(vocab)))
        if lib.llama_vocab_get_add_eos(vocab):
            needed.append(("EOS", lib.llama_vocab_eos(vocab)))
    missing = [name for name, token in needed if token == null]
    if missing:
        return None, (f"{path.name}'s vocabulary adds {'/'.join(missing)} tokens but has none: "
                      "tokenize with add_bos=False")
    return None, None
