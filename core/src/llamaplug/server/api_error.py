"""`ApiError` and the typed errors the server raises, with `STATUS_BY_CLASS`, the one table of an error class's
HTTP status. Apart from errors.py: the registry raises these, and a server loads its model before the web stack
(FastAPI, the schemas) has imported, so this module imports none of it."""

from __future__ import annotations

from typing import Any

from ..errors import (
    BackendError,
    ClosedError,
    DecodeError,
    EngineError,
    KvCacheFullError,
    LlamaError,
    ModelNotFoundError,
)


class ApiError(Exception):
    """An error response: HTTP `status`, OpenAI's error `kind` (its "type"), the request field `param`, a `code`.

    `native` holds what llama-server's shape has beyond code/message/type (its own "type" included, where the
    status alone does not say it: "exceed_context_size_error" with n_prompt_tokens and n_ctx). `headers` go
    with it (Retry-After on a 503 of a full queue).

    The server raises the typed errors below, whose class gives the status (`STATUS_BY_CLASS`); an `ApiError`
    built from a status is for a status some other part already chose (Starlette's HTTPException's).
    """

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, native: dict[str, Any] | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code
        self.native = native or {}
        self.headers = headers


class TypedApiError(ApiError):
    """An `ApiError` whose status, and default error type and code, its class has in `STATUS_BY_CLASS`."""

    def __init__(self, message: str, kind: str | None = None, param: str | None = None, code: str | None = None,
                 native: dict[str, Any] | None = None, headers: dict[str, str] | None = None):
        status, default_kind, default_code = status_of(type(self))
        super().__init__(status, message, kind or default_kind or "invalid_request_error", param, code or default_code,
                         native, headers)


class BadRequestError(TypedApiError):
    """The request is wrong: a field out of range, a form the server does not take; `param` names the field."""


class ModelExistsError(BadRequestError):
    """A model added or copied under a name a served model already has."""


class ModelNotAutoloadedError(BadRequestError):
    """The model is not loaded and the server loads models only when told (--no-models-autoload)."""


class ModelPinnedError(BadRequestError):
    """A model the server was given loaded (or its only one), which it cannot unload or remove."""


class UnauthorizedError(TypedApiError):
    """No API key, or the wrong one."""


class ForbiddenError(TypedApiError):
    """A request the server's settings refuse whoever sends it (a cross-origin one, cors.py)."""


class NotFoundError(TypedApiError):
    """Nothing at that path (a page file, the chat page when it is off)."""


class ModelNotServedError(NotFoundError):
    """A `model` this server does not serve."""


class BodyTooLargeError(TypedApiError):
    """A request body over --max-body-mib."""


class ClientGoneError(TypedApiError):
    """The client went away before its answer (nginx's 499: nobody reads it, the access log and counters do)."""


class ServerFaultError(TypedApiError):
    """The server failed at what it should do (a folder it cannot open, a model file it cannot read)."""


class ModelLoadError(ServerFaultError):
    """A model failed to load."""


class BadGatewayError(TypedApiError):
    """A server this one asks for the client (the MCP CORS proxy's target) could not be reached."""


class NotSupportedError(TypedApiError):
    """An endpoint this server was started without (llama-server's 501)."""


class UnavailableError(TypedApiError):
    """The server cannot serve this now; another replica, or a retry later, may."""


class ModelNotLoadedError(UnavailableError):
    """The model is not loaded (unloaded, loading, sleeping, or loading again after its engine stopped)."""


class QueueFullError(UnavailableError):
    """Already --max-queue requests wait."""


class NoRoomError(UnavailableError):
    """A model to load with --max-loaded models loaded, none of which can be unloaded."""


# The one table of an error's HTTP status: (status, OpenAI's error "type", code) by class, the nearest in an
# error's MRO. For a LlamaError, what it is answered with (one not listed is the client's fault: 400, its field
# and class named); for a typed ApiError, its status and the type and code it has unless given others.
STATUS_BY_CLASS: dict[type[Exception], tuple[int, str | None, str | None]] = {
    ClosedError: (503, "server_error", "closed"),  # closed or shutting down: another replica or a retry may serve
    ModelNotFoundError: (404, "invalid_request_error", "model_not_found"),
    DecodeError: (500, "server_error", "decode_failed"),
    EngineError: (500, "server_error", "engine_failed"),
    KvCacheFullError: (500, "server_error", "kv_cache_full"),  # the shared cache: no one request's fault
    BackendError: (500, "server_error", "backend_failed"),
    LlamaError: (400, "invalid_request_error", None),
    BadRequestError: (400, "invalid_request_error", None),
    ModelExistsError: (400, "invalid_request_error", "model_exists"),
    ModelPinnedError: (400, "invalid_request_error", "model_pinned"),
    UnauthorizedError: (401, "authentication_error", "invalid_api_key"),
    ForbiddenError: (403, "permission_error", None),
    NotFoundError: (404, "invalid_request_error", "not_found"),
    ModelNotServedError: (404, "invalid_request_error", "model_not_found"),
    BodyTooLargeError: (413, "invalid_request_error", "request_too_large"),
    ClientGoneError: (499, "invalid_request_error", None),
    ServerFaultError: (500, "server_error", None),
    ModelLoadError: (500, "server_error", "model_load_failed"),
    NotSupportedError: (501, "not_supported_error", None),
    BadGatewayError: (502, "server_error", "bad_gateway"),
    UnavailableError: (503, "server_error", None),
    ModelNotLoadedError: (503, "server_error", "model_not_loaded"),
    QueueFullError: (503, "server_error", "queue_full"),
    NoRoomError: (503, "server_error", "no_room"),
}


def status_of(kind: type[Exception]) -> tuple[int, str | None, str | None]:
    """(status, error type, code) of an error class: its nearest class's in `STATUS_BY_CLASS`."""
    for base in kind.__mro__:
        if base in STATUS_BY_CLASS:
            return STATUS_BY_CLASS[base]
    raise TypeError(f"no HTTP status for {kind.__name__}: add it to STATUS_BY_CLASS")
