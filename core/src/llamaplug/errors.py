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
    """Base of every error llamaplug raises.

    Catch it to handle any llamaplug failure; the message says what was wrong and where. Raised as
    itself only for a native call with no finer class (a llama.cpp function returning an unknown code).
    """


class BackendError(LlamaError):
    """A compute backend could not be found, probed or loaded.

    Raised by `LlamaBackend.init(backends=[...])` when a named backend's probe fails here (the message
    has the probe's reason), for a `GGML_BACKEND_PATH` that is not an absolute module path, and when the
    backend is initialised twice in different ways. Do: run `llamaplug info` to see each plugin's probe
    verdict, and name a backend whose probe passes (or leave `backends` to the probes).
    """


class NoBackendError(BackendError):
    """No usable compute backend is installed.

    Raised by `LlamaBackend.init` when no backend plugin's probe passes, or a named backend is not
    installed. Do: `pip install llamaplug-backend-cpu` (or the backend the message names).
    """


class BackendNotInitialisedError(BackendError):
    """The native backend was used before LlamaBackend.init().

    Raised by `LlamaModel(path)` when no backend is initialised. Do: call `LlamaBackend.init()` first,
    or use `LlamaModel.load(path)` / `Llama.load(params)`, which initialise it.
    """


class BackendMismatchError(BackendError):
    """A backend module was built from another llama.cpp than the core.

    Raised by `LlamaBackend.init` when the only usable backend plugin was built for another llama.cpp
    commit or ggml version than the core (`llamaplug info` shows both). Do: install the backend plugin
    of the same llamaplug version (`pip install llamaplug-backend-cpu==<core version>`), or rebuild it.
    """


class ModelNotFoundError(LlamaError, FileNotFoundError):
    """The model path does not exist or is not a file.

    Raised when a model, adapter or control-vector path is missing, and by `catalog.default_model()`
    when no catalog model is installed. Also a `FileNotFoundError`. Do: check the path; `make run`
    (or the catalog's message) installs the default model.
    """


class InvalidModelError(LlamaError):
    """The file exists but llama.cpp cannot load it as a model.

    Raised for a file that is not GGUF, is truncated or damaged, has an unknown architecture, cannot
    be mmapped (then load with `use_mmap=False`), or lacks what was asked of it (infill tokens, a
    tokenizer); also for a bad LoRA adapter or control vector. The message has llama.cpp's reason.
    Do: `llamaplug inspect FILE` shows what the file holds; re-download it or use a supported model.
    """


class LoadCancelledError(LlamaError):
    """The progress callback returned False: the model was not loaded.

    Raised by `LlamaModel` / `Llama.load` when `progress_callback` returned False. Nothing to fix:
    it is the cancellation you asked for.
    """


class ContextTooLargeError(LlamaError):
    """The context (KV cache and buffers) could not be allocated.

    Raised when creating a context (`LlamaContext`, `Llama.load`) whose `n_ctx` needs more memory than
    the machine has, or when llama.cpp fails to allocate its buffers; the message says how much it
    needs, and the model's training context. Do: lower `n_ctx` (the message gives an upper bound;
    `n_ctx=0` takes the training context), `n_seq_max` or `n_ubatch`, or use a quantized KV cache
    (`type_k`/`type_v="q8_0"`).

    Not raised for an `n_ctx` that fits in memory but is past the training context: that loads (as
    llama.cpp loads it, for RoPE scaling) with a warning on the "llamaplug.context" logger, as does an
    `n_ctx` that llama.cpp rounds up (to a multiple of 256 per sequence: 100 becomes 256).
    """


class ContextOverflowError(LlamaError):
    """The tokens do not fit in the context window.

    Raised when a prompt or an input to embed is as long as a sequence's share of the context or
    longer (n_ctx / n_seq_max), when a decode has no free KV cell (llama_decode's code 1), or a
    position is past `n_ctx`. A prompt that fits but leaves less room than `max_tokens` is not an
    error: generation stops when the sequence is full, with `stop_reason=StopReason.CONTEXT_FULL`
    (finish_reason "length" on the server), as llama-server stops. Do: shorten the prompt, raise
    `n_ctx`, or clear the sequence (`kv_cache_seq_rm`) first.
    """


class KvCacheFullError(ContextOverflowError):
    """The KV cache that every sequence shares (ContextParams.kv_unified) has no room for a step's tokens,
    even after the idle sequences gave theirs back: every request in that step ends with this error, as
    llama-server ends every running slot ("Context size has been exceeded"). Not the fault of one request
    (a server answers 500). Do: fewer requests at once (n_seq_max), a larger n_ctx, smaller max_tokens, or
    kv_unified off (each sequence then has its own n_ctx / n_seq_max cells and stops at their end).
    """


class DecodeError(LlamaError):
    """llama_decode / llama_encode failed; `code` is llama.cpp's return code.

    Raised for codes other than 0 and 1: 2 (aborted, e.g. by `Llama.cancel()`), -1 (invalid batch),
    -2 (compute buffers could not be allocated), -3 (the compute graph failed). Do: for -2 lower
    `n_batch`/`n_ubatch` or offload fewer layers; for -3 see the llama.cpp lines in the message (often
    a backend problem: try another backend).
    """

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class InvalidParameterError(LlamaError, ValueError):
    """A parameter is out of range or of the wrong type; `field` names it.

    Raised by every params model (`LlamaParams`, `SamplerParams`, ...) on a wrong name or value, and by
    calls given a bad argument (an empty sampler chain, a bad `response_format`, ...). Also a
    `ValueError`. Do: fix the field the message names; the Context API page lists every field.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class ReplyValidationError(LlamaError, ValueError):
    """A reply does not validate against the pydantic model given as response_format; `field` names where."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class InvalidTokenError(LlamaError, ValueError):
    """A token id is outside the model's vocabulary.

    Raised before llama.cpp sees the id (it would read out of bounds): in a batch, a logit bias,
    `token_to_piece`, `detokenize`; `token` is the id. Also a `ValueError`. Do: use ids in
    `0 <= id < model.n_vocab`.
    """

    def __init__(self, message: str, token: int | None = None):
        super().__init__(message)
        self.token = token


class ClosedError(LlamaError):
    """An object was used after close() (or after its model was closed).

    Raised by any method of a closed `Llama`, model, context or sampler chain, and for requests still
    running when their `Llama` was closed. Do: keep the object open while you use it (`with` blocks
    close at the end).
    """


class RequestCancelledError(LlamaError):
    """The work of a request was stopped because its caller cancelled it (an HTTP client that went away).

    Raised inside the worker that renders, tokenizes or embeds a request, at its next check between steps
    (`blocks.cancellation`), so that a request nobody waits for stops costing CPU and memory. Nothing to fix.
    """


class EngineError(LlamaError):
    """The engine failed while running a request, in its own code rather than llama.cpp's (a bug).

    The request it touched ends with this error (the exception it caught is its `__cause__`); the
    engine clears what that request left in the cache and goes on with the others. Do: retry the
    request, and report the bug with the log line "the engine failed a step".
    """


class StateError(LlamaError):
    """A context state could not be saved or restored.

    Raised by `load_state` for a missing or damaged file, another format version, or a state saved
    with another model, and by llama.cpp's state calls failing. Do: restore a state with the model
    that saved it.
    """


class ChatTemplateError(LlamaError):
    """A chat template did not compile, or raised while rendering the messages (its message is kept).

    Raised by `create_chat_completion` and `ChatTemplate` for a Jinja template that does not compile,
    one that calls `raise_exception` (e.g. roles that do not alternate), or a built-in template
    llama.cpp cannot apply. Do: fix the messages as the template's message says, or pass `chat_template=`.
    """


class SamplingError(LlamaError):
    """A sampler chain could not pick a token (it selects none, or every candidate was removed).

    Raised by `sample()` when the samplers removed every candidate (e.g. a `-inf` logit bias on every
    token, or a grammar that allows nothing more), instead of llama.cpp's abort. Do: loosen the
    chain (biases, grammar, `min_keep`).
    """


class TokenizerError(LlamaError):
    """An external tokenizer (LlamaParams(tokenizer=...)) that cannot be loaded or used.

    Raised when no tokenizer plugin takes the `tokenizer=` value, or the plugin it names is not
    installed. Do: `pip install llamaplug-tokenizer-hf` for `"hf:..."`, or check the path.
    """


class TokenizerMismatchError(TokenizerError):
    """An external tokenizer whose vocabulary is not the model's: `ids` are the token ids that differ.

    Raised by the tokenizer plugin when the tokenizer.json given with `tokenizer=` maps tokens to other
    ids than the GGUF. Do: use the tokenizer.json of the same model (or leave `tokenizer` to the GGUF's).
    """

    def __init__(self, message: str, ids: list[int] | None = None):
        super().__init__(message)
        self.ids = ids or []


class UnsupportedVocabError(TokenizerError):
    """A vocabulary (tokenizer.ggml.model / .pre, in `kind`) that cannot be exported as a tokenizer.json.

    Raised by llamaplug-tokenizer-hf's export for a pre-tokenizer or vocabulary type it cannot write
    faithfully. Do: use the model's own tokenizer.json, or the GGUF's tokenizer (the default).
    """

    def __init__(self, message: str, kind: str | None = None):
        super().__init__(message)
        self.kind = kind


class DraftVocabMismatchError(LlamaError):
    """A draft model (LlamaParams.draft_model_path) whose vocabulary is not the target's: the message says what."""


class InvalidGrammarError(InvalidParameterError):
    """llama.cpp's parser refused a GBNF grammar: `line`, `column` (1-based) and `reason` say where and why.

    Raised by `Grammar.from_string` / `Grammar.from_file` and `SamplerChain.grammar` (a JSON schema
    that cannot be converted is `json_schema.UnsupportedSchemaError`, another `InvalidParameterError`).
    Do: fix the grammar at the line and column given.
    """

    def __init__(self, message: str, line: int | None = None, column: int | None = None, reason: str | None = None,
                 path: str | None = None):
        super().__init__(message, field="grammar")
        self.line, self.column, self.reason, self.path = line, column, reason, path


class QuantizeError(LlamaError):
    """llama_model_quantize refused or failed (requantizing without allow_requantize, a type that needs an
    imatrix, an unwritable output): the message carries llama.cpp's reason."""


class HubError(LlamaError):
    """A model could not be listed or fetched from the Hugging Face Hub (or its local cache), or
    huggingface_hub is not installed."""


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
