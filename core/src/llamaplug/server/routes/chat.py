"""/v1/chat/completions: a reply through the model's chat template, tool calls and response_format included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from ...high.chat import ChatCompletion, ChatCompletionChunk, ChatStream, Usage, as_chat
from ...high.engine import Job
from ...high.events import achunks, agather_chunks
from ...high.requests import chat_job, collect
from ..deps import served_model, token_limit
from ..errors import ERROR_RESPONSES
from ..registry import Served
from ..schemas import ChatRequest
from ..streaming import sse, unless_gone

router = APIRouter()


@router.post("/v1/chat/completions", response_model=ChatCompletion, responses=ERROR_RESPONSES)
async def chat(body: ChatRequest, request: Request,
               served: Annotated[Served, Depends(served_model(ChatRequest))]) -> Any:
    llama = served.llama
    limit = token_limit(request, body.max_completion_tokens if body.max_completion_tokens is not None
                        else body.max_tokens)
    sampler = body.sampling(llama.params.seed, served.sampling).build_chain(llama.model)
    job, kind = chat_job(llama, body.messages, limit, sampler, body.stop, body.tools, body.tool_choice,
                         body.response_format, served.chat_template, own_sampler=True)
    if body.stream:
        return sse(_events(served, job, ChatStream(served.id, kind), body.include_usage))
    pieces = await unless_gone(request, agather_chunks(llama.engine, job))
    return as_chat(collect(pieces, job.prompt), served.id, kind)


async def _events(served: Served, job: Job, stream: ChatStream, include_usage: bool = False) -> AsyncIterator[str]:
    yield stream.first().model_dump_json(exclude_none=True)
    n_out, n_prompt = 0, 0
    async for piece in achunks(served.llama.engine, job):
        n_out += len(piece.tokens)
        if piece.timings is not None:
            n_prompt = piece.timings.prompt_tokens
        for out in stream.feed(piece):
            yield out.model_dump_json(exclude_none=True)
    if include_usage:  # OpenAI's stream_options: one more chunk, no choices, the usage
        usage = Usage(prompt_tokens=n_prompt, completion_tokens=n_out, total_tokens=n_prompt + n_out)
        yield ChatCompletionChunk(id=stream.ident, created=stream.created, model=stream.model, choices=[],
                                  usage=usage).model_dump_json(exclude_none=True)


# llama-server's spelling without /v1 (one operation in the OpenAPI document).
router.add_api_route("/chat/completions", chat, methods=["POST"], response_model=ChatCompletion,
                     responses=ERROR_RESPONSES, include_in_schema=False)
