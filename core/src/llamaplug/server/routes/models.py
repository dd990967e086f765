"""/v1/models: the served models."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from ..deps import models as served_models
from ..errors import ERROR_RESPONSES
from ..registry import ModelRegistry, Served
from ..schemas import ModelCard, ModelList

router = APIRouter()


@router.get("/v1/models", responses=ERROR_RESPONSES)
async def models(registry: Annotated[ModelRegistry, Depends(served_models)]) -> ModelList:
    return ModelList(data=[ModelCard(id=m.id, created=m.created,
                                          capabilities=_capabilities(m)) for m in registry])


def _capabilities(served: Served) -> list[str]:
    """As llama-server's /models: "multimodal" when a projector is open (the chat page then offers image upload)."""
    return ["completion", "multimodal"] if served.llama.projector is not None else ["completion"]
