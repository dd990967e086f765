"""The OpenAI-compatible HTTP API over one Llama: every client's requests share the engine's batches.

Errors are OpenAI's shape ({"error": {"message", "type", "param", "code"}}): bad
requests 400 (the field named in `param`), a missing or wrong key 401, an unknown
model 404, a closed server 503. A client that goes away mid-request (streamed or
not) cancels its request: its slot is free at the engine's next step.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from ..errors import ClosedError, LlamaError
from ..high.async_llama import AsyncLlama
from ..high.chat import ChatCompletion, ChatStream, Usage, as_chat
from ..high.completion import Completion, CompletionChunk
from ..high.engine import Job
from ..high.events import achunks, astream
from ..high.llama import Llama
from ..high.requests import chat_job, collect, collect_many, completion_job
from ..params import SamplerParams
from .metrics import Metrics
from .schemas import (
    ChatRequest,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    Embedding,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
    ErrorBody,
    ModelCard,
    ModelList,
    TextCompletion,
)

T = TypeVar("T")
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 401, 404, 503)}


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code


def create_app(llama: Llama, model_id: str | None = None, api_key: str | None = None,
               pooling: str | None = None) -> FastAPI:
    """The ASGI app serving `llama` (closed when the app shuts down).

    `pooling` for /v1/embeddings: default the model's own, and mean for a model that has
    none (a generative model: OpenAI's shape has one vector per input, not one per token).
    """
    allama = AsyncLlama(llama)
    pooling = pooling or _own_pooling(llama)
    model_id = model_id or llama.params.model_path.name
    created = int(time.time())
    metrics = Metrics(llama.engine)
    app = FastAPI(title="llamaplug", summary="OpenAI-compatible API over llama.cpp", version=_version())
    app.state.llama = llama
    app.state.metrics = metrics

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        metrics.http_requests += 1
        if api_key is not None and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                metrics.http_errors += 1
                return _error(ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)",
                                       "authentication_error", code="invalid_api_key"))
        response: Response = await call_next(request)
        if response.status_code >= 400:
            metrics.http_errors += 1
        return response

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        if first.get("type") == "json_invalid":
            return _error(ApiError(400, f"the body is not valid JSON: {first.get('msg', '')}", param="body"))
        return _error(ApiError(400, f"{where or 'body'}: {first.get('msg', 'invalid')}", param=where))

    @app.exception_handler(LlamaError)
    async def llama_error(request: Request, exc: LlamaError) -> JSONResponse:
        if isinstance(exc, ClosedError):
            return _error(ApiError(503, str(exc), "server_error", code="closed"))
        return _error(ApiError(400, str(exc), param=getattr(exc, "field", None), code=type(exc).__name__))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _error(ApiError(exc.status_code, str(exc.detail), "invalid_request_error"))

    def check_model(name: str | None) -> None:
        if name is not None and name != model_id:
            raise ApiError(404, f"model {name!r} is not served here (this server has {model_id!r})",
                           param="model", code="model_not_found")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models", responses=_ERRORS)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model_id, created=created)])

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> str:
        return metrics.render()

    @app.post("/v1/completions", response_model=TextCompletion, responses=_ERRORS)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        check_model(body.model)
        prompts = _prompts(body.prompt)
        chains = [_sampler(body, llama) for _ in prompts]
        jobs = [completion_job(llama, p, body.max_tokens, chain, body.stop, body.logprobs, False, body.response_format,
                               True) for p, chain in zip(prompts, chains)]
        ident = f"cmpl-{uuid.uuid4().hex[:24]}"
        if body.stream:
            return _sse(_completion_events(llama, jobs, ident, model_id))
        events: list[tuple[int, CompletionChunk]] = []

        async def run() -> None:
            async for event in astream(llama.engine, jobs):
                events.append(event)

        await _unless_gone(request, run())
        done = collect_many(events, jobs)
        return TextCompletion(
            id=ident, created=int(time.time()), model=model_id,
            choices=[CompletionChoice(index=i, text=c.text, finish_reason=_finish(c),
                                      logprobs=_logprobs(c, llama) if body.logprobs is not None else None)
                     for i, c in enumerate(done)],
            usage=_usage(sum(len(c.prompt_tokens) for c in done), sum(len(c.tokens) for c in done)))

    @app.post("/v1/chat/completions", response_model=ChatCompletion, responses=_ERRORS)
    async def chat(body: ChatRequest, request: Request) -> Any:
        check_model(body.model)
        limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        job, kind = chat_job(llama, body.messages, limit, _sampler(body, llama), body.stop, body.tools,
                             body.tool_choice, body.response_format, own_sampler=True)
        if body.stream:
            return _sse(_chat_events(llama, job, ChatStream(model_id, kind)))
        pieces: list[CompletionChunk] = []

        async def run() -> None:
            async for piece in achunks(llama.engine, job):
                pieces.append(piece)

        await _unless_gone(request, run())
        return as_chat(collect(pieces, job.prompt), model_id, kind)

    @app.post("/v1/embeddings", response_model=EmbeddingList, responses=_ERRORS)
    async def embeddings(body: EmbeddingRequest) -> Any:
        check_model(body.model)
        texts = [body.input] if isinstance(body.input, str) else body.input
        if not texts:
            raise ApiError(400, "input is empty", param="input")
        vectors = await allama.embed(texts, pooling=pooling)
        n_tokens = sum(len(llama.tokenize(t)) for t in texts)
        data = [Embedding(index=i, embedding=_encode(v, body.encoding_format)) for i, v in enumerate(vectors)]
        return EmbeddingList(data=data, model=model_id, usage=EmbeddingUsage(prompt_tokens=n_tokens,
                                                                               total_tokens=n_tokens))

    @app.on_event("shutdown")
    async def close() -> None:
        await asyncio.to_thread(llama.close)

    return app


def _version() -> str:
    from .. import __version__

    return __version__


def _own_pooling(llama: Llama) -> str | None:
    meta = llama.model.metadata
    own = meta.get(f"{meta.get('general.architecture', '')}.pooling_type", "0")
    return None if own not in ("0", "-1") else "mean"  # 0 none, -1 unspecified


def _error(exc: ApiError) -> JSONResponse:
    body = {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.code}}
    return JSONResponse(body, status_code=exc.status)


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise ApiError(400, "prompt is empty", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]


def _sampler(body: Any, llama: Llama) -> Any:
    """The request's own chain (llama-server's defaults where the request says nothing)."""
    given = {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k, "min_p": body.min_p,
             "seed": body.seed if body.seed is not None else llama.params.seed,
             "penalty_present": body.presence_penalty, "penalty_freq": body.frequency_penalty,
             "penalty_repeat": body.repeat_penalty}
    try:
        params = SamplerParams(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first.get("loc") else None
        raise ApiError(400, f"{field}: {first['msg']}", param=field) from None
    return params.build_chain(llama.model)


def _finish(done: Completion | CompletionChunk) -> str:
    from ..high.completion import StopReason

    reason = done.stop_reason
    return "length" if reason in (StopReason.MAX_TOKENS, StopReason.CONTEXT_FULL) else "stop"


def _usage(n_prompt: int, n_out: int) -> Usage:
    return Usage(prompt_tokens=n_prompt, completion_tokens=n_out, total_tokens=n_prompt + n_out)


def _logprobs(done: Completion, llama: Llama) -> CompletionLogprobs:
    lps = done.logprobs or []
    offsets, at = [], 0
    for lp in lps:
        offsets.append(at)
        at += len(lp.text)
    return CompletionLogprobs(tokens=[lp.text for lp in lps], token_logprobs=[lp.logprob for lp in lps],
                              top_logprobs=[{llama.model.token_to_str(t): v for t, v in lp.top} for lp in lps],
                              text_offset=offsets)


def _encode(vector: Any, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.astype(float).tolist()


async def _unless_gone(request: Request, work: Awaitable[T]) -> T:
    """Run `work`, cancelling it if the client disconnects first."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.05)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            raise ApiError(499, "the client went away")


def _sse(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _completion_events(llama: Llama, jobs: list[Job], ident: str, model: str) -> AsyncIterator[str]:
    created = int(time.time())
    try:
        async for i, chunk in astream(llama.engine, jobs):
            if not chunk.text and chunk.stop_reason is None:
                continue
            choice = CompletionChoice(index=i, text=chunk.text,
                                      finish_reason=_finish(chunk) if chunk.stop_reason is not None else None)
            yield _data(TextCompletion(id=ident, created=created, model=model, choices=[choice]).model_dump_json())
    except LlamaError as exc:  # the status line is sent: the error goes in the stream
        yield _data(json.dumps({"error": {"message": str(exc), "type": "server_error", "code": type(exc).__name__}}))
    yield "data: [DONE]\n\n"


async def _chat_events(llama: Llama, job: Job, stream: ChatStream) -> AsyncIterator[str]:
    yield _data(stream.first().model_dump_json(exclude_none=True))
    try:
        async for piece in achunks(llama.engine, job):
            for out in stream.feed(piece):
                yield _data(out.model_dump_json(exclude_none=True))
    except LlamaError as exc:
        yield _data(json.dumps({"error": {"message": str(exc), "type": "server_error", "code": type(exc).__name__}}))
    yield "data: [DONE]\n\n"


def _data(payload: str) -> str:
    return f"data: {payload}\n\n"
