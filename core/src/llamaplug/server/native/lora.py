"""GET and POST /lora-adapters: llama-server's LoRA endpoints (serve --lora / --lora-scaled).

GET lists the adapters loaded with the model, in the order given (their ids), each with its scale now. POST
takes [{"id", "scale"}] and sets the scales of every later request, as llama-server's: an adapter the body
leaves out goes to scale 0. A bad body, id or scale is a 400 naming the field (llama-server skips an unknown id).

The engine has one context, so a scale is changed between steps with no request running (`Engine.idle`): a
POST waits until the requests running and waiting have ended (they keep the scales they started with, as in
llama-server), at most IDLE_WAIT seconds, then a 503. The KV that the slots and the prompt cache hold was
computed at the old scales: it is forgotten.

A request's own `lora` field (llama-server batches only requests with the same adapter set together) is not
supported: one that differs from the scales set now is a 400 (`PerRequestLora`), never silently ignored.
"""

from __future__ import annotations

import json
import math
import time
from typing import Annotated, Any

from fastapi import Body, Depends, Request

from ...errors import InvalidParameterError
from ..deps import queried_model
from ..dialects import NATIVE
from ..errors import ERROR_RESPONSES, BadRequestError, UnavailableError
from ..registry import Served
from ..streaming import off_loop

router = NATIVE.router()

IDLE_WAIT = 60.0  # seconds a POST waits for the requests running to end


@router.get("/lora-adapters", responses=ERROR_RESPONSES)
async def get_lora_adapters(served: Annotated[Served, Depends(queried_model)]) -> list[dict[str, Any]]:
    given = served.llama.params.lora
    scales = list(served.llama.context.loras.values())
    return [{"id": i, "path": str(path), "scale": scales[i] if i < len(scales) else scale,
             "task_name": "", "prompt_prefix": ""} for i, (path, scale) in enumerate(given)]


def parse_scales(body: Any, n: int) -> list[float]:
    """llama-server's [{"id", "scale"}] as the scale of each of the `n` adapters (0 where not given)."""
    if not isinstance(body, list):
        raise BadRequestError("Request body must be an array of {\"id\", \"scale\"}", param="lora")
    scales = [0.0] * n
    for i, entry in enumerate(body):
        if not isinstance(entry, dict):
            raise BadRequestError(f"lora[{i}] must be an object {{\"id\", \"scale\"}}", param=f"lora[{i}]")
        adapter = entry.get("id")
        if isinstance(adapter, bool) or not isinstance(adapter, int) or not 0 <= adapter < n:
            raise BadRequestError(f"lora[{i}].id: no LoRA adapter {adapter!r} (ids 0 to {n - 1} are loaded)"
                                  if n else f"lora[{i}].id: no LoRA adapter is loaded (serve --lora)",
                                  param=f"lora[{i}].id")
        scale = entry.get("scale", 0.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise BadRequestError(f"lora[{i}].scale must be a finite number, got {scale!r}", param=f"lora[{i}].scale")
        scales[adapter] = float(scale)
    return scales


def set_scales(served: Served, scales: list[float]) -> None:
    """The adapters' scales, set between engine steps with nothing running (waits up to IDLE_WAIT seconds); the
    KV the idle slots and the prompt cache hold, computed at the old scales, is forgotten."""
    llama = served.llama
    deadline = time.monotonic() + IDLE_WAIT
    while True:
        try:
            with llama.engine.idle("setting the LoRA scales", forget=True):
                for adapter, scale in zip(list(llama.context.loras), scales):
                    if llama.context.loras[adapter] != scale:  # each set drops the cached KV: only a change
                        llama.context.set_lora(adapter, scale)
            return
        except InvalidParameterError as exc:
            if exc.field != "state":
                raise
            if time.monotonic() > deadline:
                raise UnavailableError(f"requests ran for {IDLE_WAIT:.0f} s: the LoRA scales are set between "
                                       "requests; try again") from None
            time.sleep(0.02)


@router.post("/lora-adapters", responses=ERROR_RESPONSES)
async def post_lora_adapters(request: Request, served: Annotated[Served, Depends(queried_model)],
                             body: Annotated[Any, Body()] = None) -> dict[str, bool]:
    scales = parse_scales(body, len(served.llama.params.lora))
    await off_loop(lambda: set_scales(served, scales))
    request.app.state.lora_scales = scales
    return {"success": True}


_GENERATING = frozenset({"/completion", "/completions", "/v1/completions", "/chat/completions",
                         "/v1/chat/completions"})


class PerRequestLora:
    """ASGI middleware: a request to a completion route whose body has a `lora` field that differs from the
    scales set now (app.state.lora_scales) is a 400; the others pass on, their body replayed as read."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in _GENERATING:
            await self.app(scope, receive, send)
            return
        messages, chunks = [], []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        refusal = _refusal(b"".join(chunks), getattr(scope["app"].state, "lora_scales", []))
        if refusal is not None:
            payload = json.dumps({"error": {"code": 400, "message": refusal, "type": "invalid_request_error",
                                            "param": "lora"}}).encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return
        replay = iter(messages)

        async def replayed() -> dict[str, Any]:
            try:
                return next(replay)
            except StopIteration:
                return await receive()

        await self.app(scope, replayed, send)


def _refusal(raw: bytes, scales: list[float]) -> str | None:
    if b'"lora"' not in raw:
        return None
    try:
        body = json.loads(raw)
    except ValueError:
        return None  # the route says what is wrong with it
    if not isinstance(body, dict) or body.get("lora") in (None, []):  # llama-server: none or [], the global
        return None
    try:
        asked = parse_scales(body["lora"], len(scales))
    except BadRequestError as exc:
        return str(exc)
    if asked == scales:
        return None
    return ("per-request LoRA is not supported; POST /lora-adapters to set the scales of every request "
            f"(now {scales})")
