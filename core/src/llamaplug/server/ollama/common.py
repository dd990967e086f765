"""What Ollama's route modules share: its error document, a request's lease of its model, the served id a client's
name names, its timestamps and its NDJSON lines (an error that comes after the status line is the last line,
{"error": "..."})."""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from ...errors import LlamaError
from ..api_error import ModelNotServedError
from ..errors import ApiError, as_api_error
from ..registry import ModelRegistry, Served


@dataclasses.dataclass
class Leased:
    """A request's model: `served` (None for a load/unload request, which takes no lease), and its timing."""

    served: Served | None
    ident: str
    keep_alive: float | None
    started: int  # perf_counter_ns at the request's start
    load_ns: int  # the wait for the model (its load, if it was not loaded)


ERRORS: dict[int | str, dict[str, Any]] = {code: {"description": '{"error": "..."}'} for code in (400, 401, 404, 503)}


def resolve(registry: ModelRegistry, name: str) -> str:
    """The served id that an Ollama client's `name` names (`name`, `name:latest`, `name.gguf`: the registry reads
    each, as it does for /v1); Ollama's 404 if none."""
    try:
        return registry.describe(name)[0]
    except ApiError as exc:
        if exc.status != 404:
            raise
    raise ModelNotServedError(f"model '{name}' not found", param="model")


def iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def now() -> str:
    return iso(time.time())


async def ndjson(lines: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    try:
        async for line in lines:
            yield json.dumps(line, ensure_ascii=False) + "\n"
    except (LlamaError, ApiError) as exc:  # the status line is sent: the error is the last line
        yield json.dumps({"error": str(as_api_error(exc))}, ensure_ascii=False) + "\n"
