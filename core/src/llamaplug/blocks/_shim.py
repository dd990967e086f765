"""Calls into the native chat shim's JSON functions: the one way their failures and their JSON arguments are
checked (the chat layer and the JSON-schema converter both call it)."""

from __future__ import annotations

import json
from typing import Any

from ..errors import ChatTemplateError, InvalidParameterError
from ..raw import ffi, lib


def call_shim(fn: Any, *args: Any, error: type[Exception] = ChatTemplateError, what: str = "",
              refused: type[Exception] = InvalidParameterError) -> Any:
    """Run a shim function that returns a malloc'd JSON string (or a handle) and reports failures in *err:
    a request llama.cpp refuses (its invalid_argument) is `refused`, any other failure `error`."""
    err = ffi.new("char **")
    out = fn(*args, err)
    if err[0] != ffi.NULL:
        message = ffi.string(err[0]).decode("utf-8", "replace")
        lib.llamaplug_chat_string_free(err[0])
        kind, message = message[:1], message[1:]
        raise (refused if kind == "I" else error)(f"{what}{message}" if what else message)
    return out


def encode_json(value: Any, field: str) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"{field} is not JSON: {exc}", field=field) from None
    except UnicodeEncodeError:
        raise InvalidParameterError(f"{field} holds text that is not valid Unicode (a lone surrogate)",
                                    field=field) from None
