"""JSON Schema -> GBNF with llama.cpp's own converter (common/json-schema-to-grammar.cpp of the pin).

    gbnf = schema_to_gbnf({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}},
                           "required": ["n"]})

This is the converter llama-server runs for `json_schema` and `response_format`, so a schema
constrains a reply here exactly as it does there: the same grammar, the same texts accepted,
with a grammar whose size grows with the schema, not with its numbers (integer ranges are
written digit by digit, optional properties as a chain of suffixes). What it cannot convert
(an unknown `$ref`, ...) is an `UnsupportedSchemaError` with llama.cpp's reason; what it
takes loosely, llama-server takes loosely too (a `pattern` it cannot express matches any
string: its warning goes to the "llamaplug.json_schema" logger; `uniqueItems`, `not` and
unknown `format`s are not enforced). Refused before the converter sees them: numbers JSON cannot hold (NaN,
infinities, integers past 2^64), schemas nested past 200 levels or of more than 100,000
values, and objects of more than 512 optional properties (the converter's time grows with
their square: 4,000 take minutes).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ..errors import InvalidParameterError
from ..raw import ffi, lib
from ._shim import call_shim, encode_json
from ._stderr import captured_stderr as _captured_stderr

_log = logging.getLogger("llamaplug.json_schema")

MAX_DEPTH = 200
# llama.cpp's converter writes an object's optional properties as a chain of suffix rules in time that grows with
# their square (1,000 take seconds, 4,000 minutes): past this many in one object the schema is refused.
MAX_OPTIONAL = 512
MAX_NODES = 100_000


class UnsupportedSchemaError(InvalidParameterError):
    """A schema llama.cpp's converter refuses; `path` says where, when known ("#" otherwise)."""

    def __init__(self, message: str, keyword: str | None = None, path: str = "#"):
        super().__init__(f"{path}: {message}", field="schema")
        self.keyword, self.path = keyword, path


def _check_values(schema: Any, path: str = "#", depth: int = 0, seen: list[int] | None = None) -> None:
    seen = seen if seen is not None else [0]
    seen[0] += 1
    if seen[0] > MAX_NODES:
        raise UnsupportedSchemaError(f"the schema has more than {MAX_NODES} values", path=path)
    if depth > MAX_DEPTH:
        raise UnsupportedSchemaError(f"the schema nests deeper than {MAX_DEPTH} levels", path=path)
    if isinstance(schema, float) and not math.isfinite(schema):
        raise UnsupportedSchemaError(f"{schema} is not a JSON number", path=path)
    if isinstance(schema, int) and not isinstance(schema, bool) and abs(schema) >= 2 ** 64:
        raise UnsupportedSchemaError("an integer past 2^64 is more than the converter reads", path=path)
    if isinstance(schema, dict):
        properties = schema.get("properties")
        if isinstance(properties, dict):
            required = schema.get("required") if isinstance(schema.get("required"), list) else []
            optional = len([k for k in properties if k not in required])
            if optional > MAX_OPTIONAL:
                raise UnsupportedSchemaError(
                    f"an object with {optional} optional properties (at most {MAX_OPTIONAL}: llama.cpp's converter "
                    "takes time that grows with their square); make some required or split the object",
                    keyword="properties", path=f"{path}/properties")
        for key, value in schema.items():
            if not isinstance(key, str):
                raise UnsupportedSchemaError(f"key {key!r} is not a string", path=path)
            _check_values(value, f"{path}/{key}", depth + 1, seen)
    elif isinstance(schema, (list, tuple)):
        for i, value in enumerate(schema):
            _check_values(value, f"{path}/{i}", depth + 1, seen)


def check_schema(schema: Any, path: str = "#") -> None:
    """Refuse what llama.cpp's converter must not see (see the module's doc), wherever the schema goes (a chat
    request's response_format and tools reach the converter inside llama.cpp's chat layer)."""
    if isinstance(schema, dict):
        _check_values(schema, path)


def schema_to_gbnf(schema: Any) -> str:
    """The GBNF grammar of the JSON texts `schema` accepts (llama.cpp's converter)."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise InvalidParameterError(f"a JSON schema must be an object, got {type(schema).__name__}", field="schema")
    _check_values(schema)
    body = encode_json(schema, "schema")
    with _captured_stderr() as printed:  # the converter prints its warnings (a pattern it loosened) to stderr
        out = call_shim(lib.llamaplug_json_schema_to_grammar, body, error=UnsupportedSchemaError,
                        refused=UnsupportedSchemaError, what="llama.cpp cannot convert this JSON schema: ")
    for line in printed[0].splitlines() if printed else []:
        if line.strip():
            _log.warning("%s", line.strip())
    try:
        return ffi.string(out).decode("utf-8")
    finally:
        lib.llamaplug_chat_string_free(out)
