"""/v1/chat/completions: a reply through the model's chat template, tool calls and response_format included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Request

from ...high.chat import ChatCompletion, ChatPlan, ChatStream, as_chat
from ...high.engine import Job
from ...high.events import achunks, agather_chunks
from ...high.requests import chat_job, collect
from ..deps import served_model, token_limit
from ..dialects import OPENAI
from ..errors import ERROR_RESPONSES
from ..registry import Served
from ..schemas import ChatRequest
from ..streaming import off_loop, sse, unless_gone

router = OPENAI.router()


@router.post("/v1/chat/completions", response_model=ChatCompletion, responses=ERROR_RESPONSES)
async def chat(body: ChatRequest, request: Request,
               served: Annotated[Served, Depends(served_model(ChatRequest))]) -> Any:
    llama = served.llama
    limit = token_limit(request, body.max_completion_tokens if body.max_completion_tokens is not None
                        else body.max_tokens)

    def build() -> tuple[Job, ChatPlan]:
        sampler = body.sampling(llama.params.seed).build_chain(llama.model)
        return chat_job(llama, body.messages, limit, sampler, body.stop, body.tools, body.tool_choice,
                        body.response_format, own_sampler=True, **served.chat_options(**body.chat_fields()))

    job, plan = await off_loop(build)
    if body.stream:
        return sse(_events(served, job, ChatStream(served.id, plan)))
    pieces = await unless_gone(request, agather_chunks(llama.engine, job))
    return as_chat(collect(pieces, job.prompt), served.id, plan)


async def _events(served: Served, job: Job, stream: ChatStream) -> AsyncIterator[str]:
    yield stream.first().model_dump_json(exclude_none=True)
    async for piece in achunks(served.llama.engine, job):
        for out in stream.feed(piece):
            yield out.model_dump_json(exclude_none=True)


# llama-server's spelling without /v1 (one operation in the OpenAPI document).
router.add_api_route("/chat/completions", chat, methods=["POST"], response_model=ChatCompletion,
                     responses=ERROR_RESPONSES, include_in_schema=False)
