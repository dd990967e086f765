"""/v1/models: the served models."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from ..deps import models as served_models
from ..errors import ERROR_RESPONSES
from ..registry import ModelRegistry
from ..schemas import ModelCard, ModelList

router = APIRouter()


@router.get("/v1/models", responses=ERROR_RESPONSES)
async def models(registry: Annotated[ModelRegistry, Depends(served_models)]) -> ModelList:
    return ModelList(data=[ModelCard(id=m.id, created=m.created) for m in registry])


# llama-server's spelling without /v1 (one operation in the OpenAPI document).
router.add_api_route("/models", models, methods=["GET"], responses=ERROR_RESPONSES, include_in_schema=False)
