"""A tool call's parameters, read with llama-server's defaults; a wrong type or a missing one is a 400 naming it."""

from __future__ import annotations

import os
from typing import Any

from ..api_error import BadRequestError

_REQUIRED = object()


class Params:
    """`params` of a POST /tools body, with `cwd` (x-tool-cwd) the relative paths resolve against."""

    def __init__(self, given: dict[str, Any], cwd: str = ""):
        self.given, self.cwd = given, cwd

    def _get(self, name: str, kinds: tuple[type, ...], what: str, default: Any) -> Any:
        value = self.given.get(name)
        if value is None:
            if default is _REQUIRED:
                raise BadRequestError(f"params.{name} is required", param=f"params.{name}")
            return default
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise BadRequestError(f"params.{name} must be {what}", param=f"params.{name}")
        return value

    def string(self, name: str, default: Any = _REQUIRED) -> str:
        return self._get(name, (str,), "a string", default)

    def integer(self, name: str, default: Any = _REQUIRED, minimum: int | None = None) -> int:
        value = self._get(name, (int,), "an integer", default)
        if minimum is not None and value < minimum:
            raise BadRequestError(f"params.{name} must be {minimum} or more", param=f"params.{name}")
        return value

    def boolean(self, name: str, default: bool = False) -> bool:
        return self._get(name, (bool,), "true or false", default)

    def resolve(self, path: str) -> str:
        """llama-server's: a leading ~ expanded, then absolute against cwd (else the server's), "." and ".." gone."""
        if path == "~" or path.startswith(("~/", "~\\")):
            path = os.path.expanduser("~") + path[1:]
        return os.path.normpath(os.path.join(self.cwd or os.getcwd(), path))
