"""POST /infill: llama-server's fill-in-the-middle, on the model's FIM tokens (high/infill.py lays them out).

`prompt`, when given, is text the middle starts with: it goes right after the prefix, as
llama-server puts it. A model without FIM tokens is a 400 naming them (llama-server: 501),
so no bad request reads as a server fault.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from ...high.infill import infill_tokens
from ..deps import served_model
from ..dialects import NATIVE
from ..errors import ERROR_RESPONSES, BadRequestError
from ..registry import Served
from ..shared import check_room, run
from ..streaming import off_loop
from .schemas import InfillRequest

router = NATIVE.router()


@router.post("/infill", responses=ERROR_RESPONSES)
async def infill(body: InfillRequest, request: Request,
                 served: Annotated[Served, Depends(served_model(InfillRequest))]) -> Any:
    if not isinstance(body.prompt, str):
        raise BadRequestError("prompt: /infill takes text here (the start of the middle)", param="prompt")
    extra = [{"filename": e.filename, "text": e.text} for e in body.input_extra]
    tokens = await off_loop(lambda: infill_tokens(served.llama.model, body.input_prefix + body.prompt,
                                                  body.input_suffix, extra), request)
    check_room(served, tokens, "input_prefix")
    return await run(request, served, body, [tokens], [body.prompt])
