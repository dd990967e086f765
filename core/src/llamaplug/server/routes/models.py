"""/v1/models: every served model, loaded or not, with its state (as llama-server's router mode)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from ..deps import models as served_models
from ..dialects import OPENAI
from ..errors import ERROR_RESPONSES
from ..registry import ModelRegistry
from ..schemas import ModelCard, ModelList, ModelStatus

router = OPENAI.router()


@router.get("/v1/models", responses=ERROR_RESPONSES)
async def models(registry: Annotated[ModelRegistry, Depends(served_models)]) -> ModelList:
    return ModelList(data=[card(registry, name) for name in registry.names()])


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
