"""The served models, as llama-server's router mode has them: /v1/models lists every one, loaded or not, with its
state; POST /models/load and /models/unload load or unload one now.

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
from .schemas import ModelAction, ModelActionResult, ModelCard, ModelList, ModelStatus, ModelSummary

router = OPENAI.router()


@router.get("/v1/models", responses=ERROR_RESPONSES)
async def models(registry: Annotated[ModelRegistry, Depends(served_models)]) -> ModelList:
    cards = [card(registry, name) for name in registry.names()]
    return ModelList(models=[ModelSummary(name=c.id, model=c.id, capabilities=c.capabilities) for c in cards],
                     data=cards)


@router.get("/v1/models/{model:path}", responses=ERROR_RESPONSES)
async def model(model: str, registry: Annotated[ModelRegistry, Depends(served_models)]) -> ModelCard:
    return card(registry, model)


# llama-server's spelling without /v1 (one operation in the OpenAPI document).
router.add_api_route("/models", models, methods=["GET"], responses=ERROR_RESPONSES, include_in_schema=False)


def card(registry: ModelRegistry, name: str) -> ModelCard:
    ident, state, created, _ = registry.describe(name)
    aliases, tags = registry.labels(name)
    capabilities = ["completion", "multimodal"] if registry.multimodal(name) else ["completion"]
    return ModelCard(id=ident, created=created, aliases=aliases, tags=tags, status=ModelStatus(value=state.value),
                     capabilities=capabilities)


@router.post("/models/load", responses=ERROR_RESPONSES)
async def load(body: ModelAction, registry: Annotated[ModelRegistry, Depends(served_models)]) -> ModelActionResult:
    await registry.load(body.model)
    return ModelActionResult(**card(registry, body.model).model_dump())


@router.post("/models/unload", responses=ERROR_RESPONSES)
async def unload(body: ModelAction, registry: Annotated[ModelRegistry, Depends(served_models)]) -> ModelActionResult:
    await registry.unload(body.model)
    return ModelActionResult(**card(registry, body.model).model_dump())
