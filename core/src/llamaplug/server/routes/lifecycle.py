"""POST /models/load and /models/unload: load or unload one served model now (as llama-server's router mode).

Both answer when it is done: a load once the model serves, an unload once its running
requests have ended and its memory is freed. An unloaded model still loads on its next
request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from ..deps import models as served_models
from ..dialects import OPENAI
from ..errors import ERROR_RESPONSES
from ..registry import ModelRegistry
from ..schemas import ModelAction, ModelCard
from .models import card

router = OPENAI.router()


@router.post("/models/load", responses=ERROR_RESPONSES)
async def load(body: ModelAction, registry: Annotated[ModelRegistry, Depends(served_models)]) -> ModelCard:
    await registry.load(body.model)
    return card(registry, body.model)


@router.post("/models/unload", responses=ERROR_RESPONSES)
async def unload(body: ModelAction, registry: Annotated[ModelRegistry, Depends(served_models)]) -> ModelCard:
    await registry.unload(body.model)
    return card(registry, body.model)
