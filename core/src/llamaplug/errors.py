"""Every public failure of llamaplug is a LlamaError subclass.

`raise_for_status` is the one place that turns llama.cpp return codes into
exceptions, and `native_error` the one that turns a failed native call (a NULL,
a false, a refusing code) and the log lines llama.cpp printed meanwhile into one;
`check_ptr` is native_error for a returned pointer. Call sites pass what they were
doing and where, never their own mapping. Only the building blocks call them with
native results: this module sits below the raw layer and imports nothing of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar


class LlamaError(Exception):
    """Base of every error llamaplug raises."""


class BackendError(LlamaError):
    """A compute backend could not be found, probed or loaded."""


class NoBackendError(BackendError):
    """No usable compute backend is installed."""


class BackendNotInitialisedError(BackendError):
    """The native backend was used before LlamaBackend.init()."""


class BackendMismatchError(BackendError):
    """A backend module was built from another llama.cpp than the core."""


class ModelNotFoundError(LlamaError, FileNotFoundError):
    """The model path does not exist or is not a file."""


class InvalidModelError(LlamaError):
    """The file exists but llama.cpp cannot load it as a model."""


class LoadCancelledError(LlamaError):
    """The progress callback returned False: the model was not loaded."""


class ContextTooLargeError(LlamaError):
    """The context (KV cache and buffers) could not be allocated."""


class ContextOverflowError(LlamaError):
    """The tokens do not fit in the context window."""


class DecodeError(LlamaError):
    """llama_decode / llama_encode failed; `code` is llama.cpp's return code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class InvalidParameterError(LlamaError, ValueError):
    """A parameter is out of range or of the wrong type; `field` names it."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class ReplyValidationError(LlamaError, ValueError):
    """A reply does not validate against the pydantic model given as response_format; `field` names where."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class InvalidTokenError(LlamaError, ValueError):
    """A token id is outside the model's vocabulary."""

    def __init__(self, message: str, token: int | None = None):
        super().__init__(message)
        self.token = token


class ClosedError(LlamaError):
    """An object was used after close() (or after its model was closed)."""


class StateError(LlamaError):
    """A context state could not be saved or restored."""


class ChatTemplateError(LlamaError):
    """A chat template did not compile, or raised while rendering the messages (its message is kept)."""


class SamplingError(LlamaError):
    """A sampler chain could not pick a token (it selects none, or every candidate was removed)."""


class TokenizerError(LlamaError):
    """An external tokenizer (LlamaParams(tokenizer=...)) that cannot be loaded or used."""


class TokenizerMismatchError(TokenizerError):
    """An external tokenizer whose vocabulary is not the model's: `ids` are the token ids that differ."""

    def __init__(self, message: str, ids: list[int] | None = None):
        super().__init__(message)
        self.ids = ids or []


class UnsupportedVocabError(TokenizerError):
    """A vocabulary (tokenizer.ggml.model / .pre, in `kind`) that cannot be exported as a tokenizer.json."""

    def __init__(self, message: str, kind: str | None = None):
        super().__init__(message)
        self.kind = kind


class InvalidGrammarError(InvalidParameterError):
    """llama.cpp's parser refused a GBNF grammar: `line`, `column` (1-based) and `reason` say where and why."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None, reason: str | None = None,
                 path: str | None = None):
        super().__init__(message, field="grammar")
        self.line, self.column, self.reason, self.path = line, column, reason, path


# llama_decode's documented return codes (llama.h).
_DECODE_CODES = {
    1: "no KV-cache slot for the batch: the context is full (reduce the batch or increase n_ctx)",
    2: "aborted (SIGINT or the abort callback)",
    -1: "invalid input batch",
    -2: "could not allocate compute buffers",
    -3: "the compute graph failed",
}


E = TypeVar("E", bound=LlamaError)


def native_reason(lines: Sequence[str], last: int = 3) -> str:
    """What llama.cpp logged about a failure (its last `last` warning/error lines)."""
    kept = [line for line in lines if line][-last:]
    return f"llama.cpp says: {'; '.join(kept)}" if kept else "llama.cpp gave no reason"


def native_error(cls: type[E], message: str, lines: Sequence[str] | None = None, hint: str = "",
                 **attrs: Any) -> E:
    """`cls` for a native call that failed: the message, llama.cpp's logged reason, then what to do.

    `lines` are what llama.cpp logged during the call (`_native_log.capture_errors`); None where
    the call was not captured (a per-token call, or one that logs nothing): no reason is added.
    """
    reason = "" if lines is None else f": {native_reason(lines)}"
    return cls(f"{message}{reason}" + (f" ({hint})" if hint else ""), **attrs)


P = TypeVar("P")


def check_ptr(ptr: P, cls: type[LlamaError], message: str, lines: Sequence[str] | None = None, hint: str = "",
              **attrs: Any) -> P:
    """`ptr` unless it is NULL; NULL raises `native_error(cls, message, lines, hint, **attrs)`.

    A cffi pointer is false exactly when it is NULL, so this needs nothing of the raw layer.
    """
    if not ptr:
        raise native_error(cls, message, lines, hint, **attrs)
    return ptr


def raise_for_status(op: str, rc: int, **where: Any) -> None:
    """Raise the LlamaError for llama.cpp return code `rc` of operation `op`."""
    if rc == 0:
        return
    lines = where.pop("native", ())
    place = ", ".join(f"{k}={v}" for k, v in where.items())
    place = f" ({place})" if place else ""
    place += f": {native_reason(lines, 2)}" if lines else ""
    if op in ("llama_decode", "llama_encode"):
        message = f"{op} failed with code {rc}: {_DECODE_CODES.get(rc, 'unknown failure')}{place}"
        if rc == 1:
            raise ContextOverflowError(message)
        raise DecodeError(message, rc)
    raise LlamaError(f"{op} failed with code {rc}{place}")
