"""POST /apply-template: the prompt the model's chat template makes of `messages` (llama-server's endpoint)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from ...high.chat import check_messages, render_prompt
from ..deps import served_model
from ..dialects import NATIVE
from ..errors import ERROR_RESPONSES
from ..native_schemas import ApplyTemplateRequest
from ..registry import Served

router = NATIVE.router()


@router.post("/apply-template", responses=ERROR_RESPONSES)
async def apply_template(body: ApplyTemplateRequest,
                         served: Annotated[Served, Depends(served_model(ApplyTemplateRequest))]) -> dict[str, str]:
    prompt, _ = render_prompt(served.llama, check_messages(body.messages), None, None)
    return {"prompt": prompt}
