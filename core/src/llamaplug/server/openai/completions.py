"""/v1/completions: text completion of one prompt or several (sharing the engine's batches)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from ...high.chat import Usage
from ...high.completion import Completion, CompletionChunk, StopReason
from ...high.engine import Job
from ...high.events import agather, astream
from ...high.jobs import collect, collect_many, completion_jobs
from ..deps import served_model, token_limit, verbose
from ..dialects import OPENAI
from ..errors import ERROR_RESPONSES, BadRequestError
from ..registry import Served
from ..request_fields import logit_bias
from ..shared import generation_settings, partial, verbose_result
from ..streaming import off_loop, sse, unless_gone
from .schemas import CompletionChoice, CompletionLogprobs, CompletionRequest, TextCompletion

router = OPENAI.router()


@router.post("/v1/completions", response_model=TextCompletion, responses=ERROR_RESPONSES)
async def completions(body: CompletionRequest, request: Request,
                      served: Annotated[Served, Depends(served_model(CompletionRequest))]) -> Any:
    llama = served.llama
    prompts = _prompts(body.prompt)
    limit = token_limit(request, body.predict())
    sampling = body.sampling(llama.params.seed, served.sampling)
    if body.ignore_eos:
        sampling = sampling.model_copy(update={"logit_bias": logit_bias(llama.model, None, True)})
    # special tokens in the text are parsed, as llama-server's tokenize_input_prompts does (and /completion here)
    jobs = await off_loop(lambda: completion_jobs(llama, prompts, limit, sampling, body.stop, body.logprobs, True,
                                                  body.response_format), request)
    ident = f"cmpl-{uuid.uuid4().hex[:24]}"
    # llama-server's debug field: each result as /completion would write it
    settings = generation_settings(sampling, -1 if limit is None else limit, body.stop, body.stream,
                                   body.ignore_eos) \
        if verbose(request, body) else None
    if body.stream:
        return sse(_events(served, jobs, ident, body.include_usage, settings))
    done = collect_many(await unless_gone(request, agather(llama.engine, jobs)), jobs)
    reply = TextCompletion(
        id=ident, created=int(time.time()), model=served.id,
        choices=[CompletionChoice(index=i, text=c.text, finish_reason=_finish(c),
                                  logprobs=_logprobs(c, served) if body.logprobs is not None else None)
                 for i, c in enumerate(done)],
        usage=_usage(sum(len(c.prompt_tokens) for c in done), sum(c.timings.predicted_tokens for c in done)))
    if settings is None:
        return reply
    # (llama-server answers one prompt per request there: the first result)
    debug = verbose_result(served, 0, done[0], _prompt_text(served, jobs[0]), settings)
    return JSONResponse({**jsonable_encoder(reply), "__verbose": debug})


def _prompt_text(served: Served, job: Job) -> str:
    return served.llama.model.detokenize(job.prompt, special=True)


async def _events(served: Served, jobs: list[Job], ident: str, include_usage: bool = False,
                  settings: dict[str, Any] | None = None) -> AsyncIterator[str]:
    created = int(time.time())
    kept: list[list[CompletionChunk]] = [[] for _ in jobs]  # each job's pieces, for __verbose (settings given)
    async for i, chunk in astream(served.llama.engine, jobs):
        if settings is not None:
            kept[i].append(chunk)
        if not chunk.text and chunk.stop_reason is None:
            continue
        choice = CompletionChoice(index=i, text=chunk.text,
                                  finish_reason=_finish(chunk) if chunk.stop_reason is not None else None)
        text = TextCompletion(id=ident, created=created, model=served.id, choices=[choice]).model_dump_json()
        if settings is not None:  # llama-server: every chunk says itself as /completion's stream would
            produced = sum(len(c.tokens) for c in kept[i])
            debug = partial(i, chunk, produced, len(jobs[i].prompt)) if chunk.stop_reason is None else \
                verbose_result(served, i, collect(kept[i], jobs[i].prompt), _prompt_text(served, jobs[i]), settings)
            text = json.dumps({**json.loads(text), "__verbose": debug})
        yield text
    if include_usage:  # OpenAI's stream_options: one more chunk, no choices, the usage
        yield TextCompletion(id=ident, created=created, model=served.id, choices=[],
                             usage=_usage(sum(len(job.prompt) for job in jobs), sum(job.produced for job in jobs))
                             ).model_dump_json()


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise BadRequestError("prompt is empty", param="prompt")
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
