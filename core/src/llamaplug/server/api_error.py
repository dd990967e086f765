"""`ApiError`, apart from errors.py: the registry raises it, and a server loads its model before the web stack
(FastAPI, the schemas) has imported, so this module imports none of it."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error response: HTTP `status`, OpenAI's error `kind` (its "type"), the request field `param`, a `code`.

    `native` holds what llama-server's shape has beyond code/message/type (its own "type" included, where the
    status alone does not say it: "exceed_context_size_error" with n_prompt_tokens and n_ctx). `headers` go
    with it (Retry-After on a 503 of a full queue).
    """

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, native: dict[str, Any] | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code
        self.native = native or {}
        self.headers = headers
