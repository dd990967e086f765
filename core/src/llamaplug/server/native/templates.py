"""POST /apply-template: the prompt the model's chat template makes of `messages` (llama-server's endpoint)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from ...high.chat import ChatSpec, plan_chat
from ..deps import served_model
from ..dialects import NATIVE
from ..errors import ERROR_RESPONSES
from ..registry import Served
from ..streaming import off_loop
from .schemas import ApplyTemplateRequest

router = NATIVE.router()


@router.post("/apply-template", responses=ERROR_RESPONSES)
async def apply_template(body: ApplyTemplateRequest,
                         served: Annotated[Served, Depends(served_model(ApplyTemplateRequest))]) -> dict[str, str]:
    fields = served.chat_options(**body.chat_fields())
    # llama-server's rendering: tools a template has no place for are left out here, refused on generation
    plan = await off_loop(lambda: plan_chat(served.llama, ChatSpec(body.messages, **fields),
                                            refuse_unseen_tools=False))
    return {"prompt": plan.params["prompt"]}
