"""POST /tokenize (with_pieces) and /detokenize: llama-server's tokenizer endpoints."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from ..deps import served_model
from ..dialects import NATIVE
from ..errors import ERROR_RESPONSES
from ..registry import Served
from ..streaming import off_loop
from .schemas import DetokenizeRequest, TokenizeRequest

router = NATIVE.router()


@router.post("/tokenize", responses=ERROR_RESPONSES)
async def tokenize(body: TokenizeRequest, request: Request,
                   served: Annotated[Served, Depends(served_model(TokenizeRequest))]) -> dict[str, Any]:
    """{"tokens": [ids]}, or with with_pieces [{"id", "piece"}] (a piece that is not whole UTF-8: its bytes)."""
    model = served.llama.model
    ids = await off_loop(lambda: model.tokenize(body.content, body.add_special, body.parse_special), request)
    if not body.with_pieces:
        return {"tokens": ids}
    pieces = []
    for token in ids:
        raw = model.token_to_piece(token, True)
        try:
            piece: str | list[int] = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)  # as llama-server: a piece that is not valid UTF-8 goes as its bytes
        pieces.append({"id": token, "piece": piece})
    return {"tokens": pieces}


@router.post("/detokenize", responses=ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, served: Annotated[Served, Depends(served_model(DetokenizeRequest))]
                     ) -> dict[str, str]:
    model = served.llama.model
    return {"content": model.detokenize(model.check_tokens(body.tokens).tolist(), True) if body.tokens else ""}
