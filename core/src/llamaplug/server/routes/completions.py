"""/v1/completions: text completion of one prompt or several (sharing the engine's batches)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Request

from ...high.chat import Usage
from ...high.completion import Completion, CompletionChunk, StopReason
from ...high.engine import Job
from ...high.events import agather, astream
from ...high.requests import collect_many, completion_jobs
from ..deps import served_model, token_limit
from ..dialects import OPENAI
from ..errors import ERROR_RESPONSES, ApiError
from ..registry import Served
from ..schemas import CompletionChoice, CompletionLogprobs, CompletionRequest, TextCompletion
from ..streaming import off_loop, sse, unless_gone

router = OPENAI.router()


@router.post("/v1/completions", response_model=TextCompletion, responses=ERROR_RESPONSES)
async def completions(body: CompletionRequest, request: Request,
                      served: Annotated[Served, Depends(served_model(CompletionRequest))]) -> Any:
    llama = served.llama
    prompts = _prompts(body.prompt)
    limit = token_limit(request, body.max_tokens)
    sampling = body.sampling(llama.params.seed, served.sampling)
    jobs = await off_loop(lambda: completion_jobs(llama, prompts, limit, sampling, body.stop, body.logprobs, False,
                                                  body.response_format))
    ident = f"cmpl-{uuid.uuid4().hex[:24]}"
    if body.stream:
        return sse(_events(served, jobs, ident, body.include_usage))
    done = collect_many(await unless_gone(request, agather(llama.engine, jobs)), jobs)
    return TextCompletion(
        id=ident, created=int(time.time()), model=served.id,
        choices=[CompletionChoice(index=i, text=c.text, finish_reason=_finish(c),
                                  logprobs=_logprobs(c, served) if body.logprobs is not None else None)
                 for i, c in enumerate(done)],
        usage=_usage(sum(len(c.prompt_tokens) for c in done), sum(len(c.tokens) for c in done)))


async def _events(served: Served, jobs: list[Job], ident: str, include_usage: bool = False) -> AsyncIterator[str]:
    created = int(time.time())
    n_out = 0
    async for i, chunk in astream(served.llama.engine, jobs):
        n_out += len(chunk.tokens)
        if not chunk.text and chunk.stop_reason is None:
            continue
        choice = CompletionChoice(index=i, text=chunk.text,
                                  finish_reason=_finish(chunk) if chunk.stop_reason is not None else None)
        yield TextCompletion(id=ident, created=created, model=served.id, choices=[choice]).model_dump_json()
    if include_usage:  # OpenAI's stream_options: one more chunk, no choices, the usage
        yield TextCompletion(id=ident, created=created, model=served.id, choices=[],
                             usage=_usage(sum(len(job.prompt) for job in jobs), n_out)).model_dump_json()


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise ApiError(400, "prompt is empty", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]


def _finish(done: Completion | CompletionChunk) -> str:
    return "length" if done.stop_reason in (StopReason.MAX_TOKENS, StopReason.CONTEXT_FULL) else "stop"


def _usage(n_prompt: int, n_out: int) -> Usage:
    return Usage(prompt_tokens=n_prompt, completion_tokens=n_out, total_tokens=n_prompt + n_out)


def _logprobs(done: Completion, served: Served) -> CompletionLogprobs:
    lps = done.logprobs or []
    offsets, at = [], 0
    for lp in lps:
        offsets.append(at)
        at += len(lp.text)
    model = served.llama.model
    return CompletionLogprobs(tokens=[lp.text for lp in lps], token_logprobs=[lp.logprob for lp in lps],
                              top_logprobs=[{model.token_to_str(t): v for t, v in lp.top} for lp in lps],
                              text_offset=offsets)
