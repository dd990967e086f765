"""The served models, as llama-server's router mode has them: /v1/models lists every one, loaded or not, with its
state; POST /models/load and /models/unload load or unload one now.

Both answer when it is done: a load once the model serves, an unload once its running
requests have ended and its memory is freed. An unloaded model still loads on its next
request.

As llama-server's router: GET /models?reload=1 (any value) reads the --models-preset file again
first, and the models a preset's dedup-cache-models hides are not listed (they are still served);
DELETE /models?model=NAME stops serving a model (unloaded once its requests are done, then
forgotten) and answers {"success": true}. A preset's model is not removable there (llama-server:
only its cache's are): take it out of the file and reload. Files are never deleted from here (as
Ollama's /api/delete; llama-server deletes a cached model's files), `llamaplug rm` deletes cached
ones.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query

from ..deps import models as served_models
from ..dialects import OPENAI
from ..errors import ERROR_RESPONSES, BadRequestError
from ..registry import ModelRegistry
from .schemas import ModelAction, ModelActionResult, ModelCard, ModelList, ModelStatus, ModelSummary

router = OPENAI.router()


@router.get("/v1/models", responses=ERROR_RESPONSES)
async def models(registry: Annotated[ModelRegistry, Depends(served_models)],
                 reload: Annotated[str | None, Query(include_in_schema=False)] = None) -> ModelList:
    if reload:  # llama-server's GET /models?reload=1: the preset file read again
        await registry.reload_presets()
    cards = [card(registry, name) for name in registry.listed()]
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


@router.delete("/models", responses=ERROR_RESPONSES)
async def delete(registry: Annotated[ModelRegistry, Depends(served_models)],
                 model: Annotated[str | None, Query()] = None) -> dict[str, bool]:
    """llama-server's DELETE /models?model=NAME (see the module's doc)."""
    if not model:
        raise BadRequestError("model must be a non-empty string", param="model")
    if registry.is_preset(model):
        raise BadRequestError(f"model {model!r} is not removable: it is a preset of --models-preset (take it out of "
                              "the file, then GET /models?reload=1)", param="model")
    await registry.remove(model)
    return {"success": True}
