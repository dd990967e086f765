"""Ollama's generation routes: /api/chat, /api/generate, /api/embed and the older /api/embeddings.

Chat goes through the chat path of /v1/chat/completions (a ChatCall, its ChatRun, ChatStream; the
translation both ways is translate.py's), so the same messages give the same text on both APIs;
/api/generate is that chat with one user message (and `system`), or with `raw` the prompt as it is
(as /v1/completions), or with `suffix` a fill-in-the-middle prompt (as /infill). Replies are Ollama's:
NDJSON lines while `stream` (its default), then a last line with done, done_reason, the token counts and
the durations in nanoseconds (total, load: the wait for the model, prompt eval, eval). Tool calls carry
their arguments as objects. A request with no messages (no prompt) loads the model, or with keep_alive 0
unloads it (done_reason "load" / "unload"), as Ollama's do.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, Request
from fastapi.responses import StreamingResponse

from ...high.chat_call import ChatRun, start_chat
from ...high.completion import Completion
from ...high.engine import Job
from ...high.events import achunks, agather_chunks
from ...high.infill import infill_tokens
from ...high.jobs import collect, completion_job
from ...high.llama import Llama
from ..deps import client_gone, models, token_limit
from ..dialects import OLLAMA
from ..errors import BadRequestError
from ..registry import ModelRegistry, Served, parse_keep_alive
from ..request_limits import check_inputs, check_messages
from ..streaming import off_loop, unless_gone
from .common import ERRORS, Leased, ndjson, now, resolve
from .schemas import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest, Sampling, response_format
from .translate import (
    chat_call,
    chat_lines,
    chat_reply,
    final_fields,
    generate_call,
    generate_lines,
    reply_message,
    think_options,
)

router = OLLAMA.router()


def leased(body_type: type[ChatRequest | GenerateRequest | EmbedRequest | EmbeddingsRequest]
           ) -> Callable[..., AsyncIterator[Leased]]:
    """The dependency leasing the model a `body_type` body names (as deps.served_model, in Ollama's names)."""

    async def lease(request: Request, body: body_type) -> AsyncIterator[Leased]:  # type: ignore[valid-type]
        started = time.perf_counter_ns()
        registry = models(request)
        ident = resolve(registry, body.model)
        keep_alive = parse_keep_alive(body.keep_alive)
        if _loads_only(body):
            yield Leased(None, ident, keep_alive, started, 0)
            return
        if isinstance(body, GenerateRequest):
            _check_generate(body)  # before the load: a refused request does not load its model
        async with registry.lease(ident, keep_alive, client_gone(request)) as served:
            yield Leased(served, ident, keep_alive, started, time.perf_counter_ns() - started)

    # FastAPI reads `body`'s type from the annotations, which `from __future__ import annotations` makes text
    # naming a local variable: give it the type itself.
    lease.__annotations__ = {"request": Request, "body": body_type}
    return lease


def _check_generate(body: GenerateRequest) -> None:
    """The fields /api/generate refuses whatever the model (checked before it is loaded)."""
    if body.template:
        raise BadRequestError("template: Ollama's Go templates are not read here; the model's own chat template "
                              "is used (or send the whole prompt with raw: true)", param="template")
    if body.context:
        raise BadRequestError("context (deprecated by Ollama) is not supported: send the conversation as /api/chat "
                              "messages", param="context")
    if body.images and (body.suffix or body.raw):
        # (images go where the chat template puts the user's message: a raw or fill-in-the-middle prompt has none)
        raise BadRequestError(f"images need the chat template: not with {'suffix' if body.suffix else 'raw'}",
                              param="images")


def _loads_only(body: Any) -> bool:
    if isinstance(body, ChatRequest):
        return not body.messages
    return isinstance(body, GenerateRequest) and not body.prompt and not body.suffix


@router.post("/api/chat", responses=ERRORS)
async def chat(body: ChatRequest, request: Request, lease: Annotated[Leased, Depends(leased(ChatRequest))]) -> Any:
    if lease.served is None:
        return await _load_or_unload(models(request), lease, body.model, {"message": reply_message("")})
    served = lease.served
    llama = served.llama
    sampling = Sampling(body.options, llama.params.seed)
    limit = token_limit(request, sampling.max_tokens)
    think = body.think
    options = think_options(served, think)

    check_messages(request, body.messages, "messages")
    for i, m in enumerate(body.messages):
        if m.images:
            _check_images(served, body.model, f"messages[{i}].images")

    run = await off_loop(lambda: start_chat(llama, chat_call(body, served, sampling, limit, options)), request)
    if body.stream:
        return _stream(chat_lines(served, run, body.model, lease, think))
    done = await unless_gone(request, run.acompletion())
    return chat_reply(body, run, done, lease)


@router.post("/api/generate", responses=ERRORS)
async def generate(body: GenerateRequest, request: Request,
                   lease: Annotated[Leased, Depends(leased(GenerateRequest))]) -> Any:
    if lease.served is None:
        return await _load_or_unload(models(request), lease, body.model, {"response": ""})
    served = lease.served
    llama = served.llama
    sampling = Sampling(body.options, llama.params.seed)
    limit = token_limit(request, sampling.max_tokens)
    form = response_format(body.format)
    prompt = body.prompt or ""
    if body.images:  # (checked with suffix and raw before the load: _check_generate)
        _check_images(served, body.model, "images")
    run: ChatRun | None = None
    if body.suffix:
        tokens = infill_tokens(llama.model, prompt, body.suffix)
        job = completion_job(llama, tokens, limit, sampling.params.build_chain(llama.model), sampling.stop, None,
                             False, form, own_sampler=True, structured_engine=body.structured_engine)
    elif body.raw:
        job = completion_job(llama, prompt, limit, sampling.params.build_chain(llama.model), sampling.stop, None,
                             True, form, own_sampler=True, structured_engine=body.structured_engine)
    else:
        call = generate_call(body, served, sampling, limit, form)
        run = await off_loop(lambda: start_chat(llama, call), request)
    # (a chat's reply goes back as the model wrote it: no reading of its reasoning or calls, as Ollama's)
    if body.stream:
        pieces = run.achunks() if run is not None else achunks(llama.engine, job)
        return _stream(generate_lines(pieces, body.model, lease))
    done = await unless_gone(request, run.acompletion() if run is not None else _completion(llama, job))
    return {"model": body.model, "created_at": now(), "response": done.text,
            **final_fields(done.stop_reason, done.timings, len(done.tokens), lease)}


@router.post("/api/embed", responses=ERRORS)
async def embed(body: EmbedRequest, request: Request, lease: Annotated[Leased, Depends(leased(EmbedRequest))]
                ) -> Any:
    served = lease.served
    assert served is not None
    texts = [body.input] if isinstance(body.input, str) else body.input
    check_inputs(request, texts, "input")
    vectors: Any = await off_loop(lambda: served.llama.embed(texts, True, served.pooling, body.truncate),
                                  request) if texts else []
    out = []
    for v in vectors:
        v = np.asarray(v, dtype=np.float64)
        if body.dimensions is not None and body.dimensions < v.shape[-1]:
            v = v[..., :body.dimensions]  # Ollama's: the first `dimensions`, normalized again
            v = v / max(float(np.linalg.norm(v)), 1e-12)
        out.append(v.tolist())
    n_tokens = sum(len(served.llama.tokenize(t)) for t in texts)
    return {"model": body.model, "embeddings": out, "total_duration": time.perf_counter_ns() - lease.started,
            "load_duration": lease.load_ns, "prompt_eval_count": n_tokens}


@router.post("/api/embeddings", responses=ERRORS)
async def embeddings(body: EmbeddingsRequest, lease: Annotated[Leased, Depends(leased(EmbeddingsRequest))]) -> Any:
    served = lease.served
    assert served is not None
    # Ollama's older route: one vector, not normalized (/api/embed's are).
    vectors = await served.allama.embed([body.prompt], False, served.pooling)
    return {"embedding": np.asarray(vectors[0], dtype=np.float64).tolist()}


def _check_images(served: Served, name: str, where: str) -> None:
    """Images need the model's projector: Ollama's 400 naming the model, and what to do, where it has none."""
    if served.llama.projector is None:
        raise BadRequestError(f"model '{name}' does not support images ({where}): serve it with its projector "
                              "(--mmproj, or mmproj in the models dir's models.toml; pip install llamaplug-mtmd)",
                              param=where)


async def _load_or_unload(registry: ModelRegistry, lease: Leased, name: str, empty: dict[str, Any]) -> Any:
    """An empty chat or generate request: load the model, or with keep_alive 0 unload it."""
    if lease.keep_alive == 0:
        await registry.unload(lease.ident)
        return {"model": name, "created_at": now(), **empty, "done": True, "done_reason": "unload"}
    async with registry.lease(lease.ident, lease.keep_alive):
        pass  # loaded (its keep-alive timer starts over)
    return {"model": name, "created_at": now(), **empty, "done": True, "done_reason": "load"}


def _stream(lines: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    return StreamingResponse(ndjson(lines), media_type="application/x-ndjson")


async def _completion(llama: Llama, job: Job) -> Completion:
    return collect(await agather_chunks(llama.engine, job), job.prompt)


