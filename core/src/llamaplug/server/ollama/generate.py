"""Ollama's generation routes: /api/chat, /api/generate, /api/embed and the older /api/embeddings.

Chat goes through the chat path of /v1/chat/completions (a ChatCall, its ChatRun, ChatStream), so
the same messages give the same text on both APIs; /api/generate is that chat with one user
message (and `system`), or with `raw` the prompt as it is (as /v1/completions), or with
`suffix` a fill-in-the-middle prompt (as /infill). Replies are Ollama's: NDJSON lines while
`stream` (its default), then a last line with done, done_reason, the token counts and the
durations in nanoseconds (total, load: the wait for the model, prompt eval, eval). Tool
calls carry their arguments as objects. A request with no messages (no prompt) loads the
model, or with keep_alive 0 unloads it (done_reason "load" / "unload"), as Ollama's do.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, Request
from fastapi.responses import StreamingResponse

from ...high.chat import ChatSpec, ChatStream
from ...high.chat_call import ChatCall, ChatRun, start_chat
from ...high.completion import Completion, CompletionChunk, CompletionTimings, StopReason
from ...high.engine import Job
from ...high.events import achunks, agather_chunks
from ...high.infill import infill_tokens
from ...high.jobs import collect, completion_job
from ...high.llama import Llama
from ..deps import models, token_limit
from ..dialects import OLLAMA
from ..errors import BadRequestError
from ..registry import ModelRegistry, Served, parse_keep_alive
from ..request_limits import check_inputs, check_messages
from ..streaming import off_loop, unless_gone
from .common import ERRORS, ndjson, now, resolve
from .schemas import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    Message,
    Sampling,
    response_format,
)

router = OLLAMA.router()


@dataclasses.dataclass
class Leased:
    """A request's model: `served` (None for a load/unload request, which takes no lease), and its timing."""

    served: Served | None
    ident: str
    keep_alive: float | None
    started: int  # perf_counter_ns at the request's start
    load_ns: int  # the wait for the model (its load, if it was not loaded)


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
        async with registry.lease(ident, keep_alive) as served:
            yield Leased(served, ident, keep_alive, started, time.perf_counter_ns() - started)

    # FastAPI reads `body`'s type from the annotations, which `from __future__ import annotations` makes text
    # naming a local variable: give it the type itself.
    lease.__annotations__ = {"request": Request, "body": body_type}
    return lease


def _loads_only(body: Any) -> bool:
    if isinstance(body, ChatRequest):
        return not body.messages
    return isinstance(body, GenerateRequest) and not body.prompt and not body.suffix


@router.post("/api/chat", responses=ERRORS)
async def chat(body: ChatRequest, request: Request, lease: Annotated[Leased, Depends(leased(ChatRequest))]) -> Any:
    if lease.served is None:
        return await _load_or_unload(models(request), lease, body.model, {"message": _message("")})
    served = lease.served
    llama = served.llama
    sampling = Sampling(body.options, llama.params.seed)
    limit = token_limit(request, sampling.max_tokens)
    think = body.think
    # Ollama's think: true/false switches the template's thinking, a level is its reasoning effort.
    options = served.chat_options(enable_thinking=think if isinstance(think, bool) else None,
                                  reasoning_effort=think if isinstance(think, str) else None)

    check_messages(request, body.messages, "messages")
    for i, m in enumerate(body.messages):
        if m.images:
            _check_images(served, body.model, f"messages[{i}].images")

    def build() -> ChatRun:
        spec = ChatSpec(chat_messages(body.messages), tools=body.tools or None, tool_choice=body.tool_choice,
                        response_format=response_format(body.format), structured_engine=body.structured_engine,
                        **options)
        return start_chat(llama, ChatCall(spec, sampling.params, max_tokens=limit, stop=sampling.stop,
                                          model=served.id))

    run = await off_loop(build, request)
    if body.stream:
        return _stream(_chat_lines(served, run, body.model, lease, think))
    done = await unless_gone(request, run.acompletion())
    reply = run.reply(done).choices[0].message
    message = _message(reply.content or "", reply.reasoning_content, body.think)
    if reply.tool_calls:
        message["tool_calls"] = [_call(i, c.id, c.function.name, c.function.arguments)
                                 for i, c in enumerate(reply.tool_calls)]
    return {"model": body.model, "created_at": now(), "message": message,
            **_final(done.stop_reason, done.timings, len(done.tokens), lease)}


@router.post("/api/generate", responses=ERRORS)
async def generate(body: GenerateRequest, request: Request,
                   lease: Annotated[Leased, Depends(leased(GenerateRequest))]) -> Any:
    if lease.served is None:
        return await _load_or_unload(models(request), lease, body.model, {"response": ""})
    if body.template:
        raise BadRequestError("template: Ollama's Go templates are not read here; the model's own chat template "
                              "is used (or send the whole prompt with raw: true)", param="template")
    if body.context:
        raise BadRequestError("context (deprecated by Ollama) is not supported: send the conversation as /api/chat "
                              "messages", param="context")
    served = lease.served
    llama = served.llama
    sampling = Sampling(body.options, llama.params.seed)
    limit = token_limit(request, sampling.max_tokens)
    form = response_format(body.format)
    prompt = body.prompt or ""
    if body.images and (body.suffix or body.raw):
        # (images go where the chat template puts the user's message: a raw or fill-in-the-middle prompt has none)
        raise BadRequestError(f"images need the chat template: not with {'suffix' if body.suffix else 'raw'}",
                              param="images")
    if body.images:
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
        messages = [Message(role="system", content=body.system)] if body.system else []
        messages.append(Message(role="user", content=prompt, images=body.images))
        call = ChatCall(ChatSpec(chat_messages(messages), response_format=form,
                                 structured_engine=body.structured_engine, **served.chat_options()),
                        sampling.params, max_tokens=limit, stop=sampling.stop, model=served.id)
        run = await off_loop(lambda: start_chat(llama, call), request)
    # (a chat's reply goes back as the model wrote it: no reading of its reasoning or calls, as Ollama's)
    if body.stream:
        pieces = run.achunks() if run is not None else achunks(llama.engine, job)
        return _stream(_generate_lines(pieces, body.model, lease))
    done = await unless_gone(request, run.acompletion() if run is not None else _completion(llama, job))
    return {"model": body.model, "created_at": now(), "response": done.text,
            **_final(done.stop_reason, done.timings, len(done.tokens), lease)}


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


def chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Ollama's messages as the OpenAI messages the chat path takes: images as image parts, tool calls with
    their arguments as JSON text, a tool result tied to its call (by id, else by the tool's name)."""
    out: list[dict[str, Any]] = []
    ids: dict[str, str] = {}  # a tool's name -> its last call's id
    for i, m in enumerate(messages):
        message: dict[str, Any] = {"role": m.role.lower(), "content": m.content or ""}
        if m.images:  # before the text, where Ollama puts a message's images (and llama-mtmd-cli its media)
            message["content"] = [*(_image_part(image, f"messages[{i}].images[{j}]")
                                    for j, image in enumerate(m.images)),
                                  *([{"type": "text", "text": m.content}] if m.content else [])]
        if m.tool_calls:
            calls = []
            for j, call in enumerate(m.tool_calls):
                ident = call.id or f"call_{i}_{j}"
                ids[call.function.name] = ident
                calls.append({"id": ident, "type": "function", "function": {
                    "name": call.function.name, "arguments": json.dumps(call.function.arguments, ensure_ascii=False)}})
            message["tool_calls"] = calls
        if m.role.lower() == "tool":
            ident = m.tool_call_id or (ids.get(m.tool_name) if m.tool_name else None)
            if ident:
                message["tool_call_id"] = ident
            if m.tool_name:
                message["name"] = m.tool_name
        out.append(message)
    return out


_IMAGE_TYPES = ((b"\x89PNG", "image/png"), (b"\xff\xd8", "image/jpeg"), (b"GIF8", "image/gif"),
                (b"RIFF", "image/webp"), (b"BM", "image/bmp"))


def _image_part(data: str, where: str) -> dict[str, Any]:
    """A base64 image (Ollama's) as the data-URL image part an OpenAI client sends."""
    try:
        head = base64.b64decode(data[:64] + "=" * (-len(data[:64]) % 4), validate=False)[:8]
    except (binascii.Error, ValueError):
        raise BadRequestError(f"{where}: not base64", param=where) from None
    kind = next((t for magic, t in _IMAGE_TYPES if head.startswith(magic)), "image/png")
    return {"type": "image_url", "image_url": {"url": f"data:{kind};base64,{data}"}}


def _check_images(served: Served, name: str, where: str) -> None:
    """Images need the model's projector: Ollama's 400 naming the model, and what to do, where it has none."""
    if served.llama.projector is None:
        raise BadRequestError(f"model '{name}' does not support images ({where}): serve it with its projector "
                              "(--mmproj, or mmproj in the models dir's models.toml; pip install llamaplug-mtmd)",
                              param=where)


def _message(content: str, thinking: str | None = None, think: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking and think is not False:
        message["thinking"] = thinking
    return message


def _call(index: int, ident: str | None, name: str, arguments: str) -> dict[str, Any]:
    """A tool call as Ollama's: the arguments an object (a model that wrote a non-object has it under "value")."""
    try:
        given = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        given = {"value": arguments}
    args = given if isinstance(given, dict) else {"value": given}
    return {**({"id": ident} if ident else {}), "function": {"index": index, "name": name, "arguments": args}}


def _done_reason(reason: StopReason | None) -> str:
    return "length" if reason in (StopReason.MAX_TOKENS, StopReason.CONTEXT_FULL) else "stop"


def _final(reason: StopReason | None, timings: CompletionTimings, n_out: int, lease: Leased) -> dict[str, Any]:
    """The last object's fields: done, done_reason, the counts and the durations (nanoseconds)."""
    return {"done": True, "done_reason": _done_reason(reason),
            "total_duration": time.perf_counter_ns() - lease.started, "load_duration": lease.load_ns,
            "prompt_eval_count": timings.prompt_tokens, "prompt_eval_duration": int(timings.prompt_ms * 1e6),
            "eval_count": n_out, "eval_duration": int(timings.predicted_ms * 1e6)}


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


async def _chat_lines(served: Served, run: ChatRun, name: str, lease: Leased, think: Any = None
                      ) -> AsyncIterator[dict[str, Any]]:
    """Ollama's stream: thinking and content as they come; a tool call whole (Ollama's clients read each
    call as one object), sent once its arguments are complete (the next call begins, or the reply ends)."""
    stream = ChatStream(served.id, run.plan)
    last: CompletionChunk | None = None
    n_out = 0
    calls: dict[int, list[Any]] = {}  # index -> [id, name, arguments so far]
    sent = 0

    def whole(upto: int) -> dict[str, Any]:
        message = _message("")
        message["tool_calls"] = [_call(i, *calls[i]) for i in range(sent, upto)]
        return {"model": name, "created_at": now(), "message": message, "done": False}

    async for piece in run.achunks():
        last = piece
        n_out += len(piece.tokens)
        for out in stream.feed(piece):
            delta = out.choices[0].delta
            for call in delta.tool_calls or []:
                if call.index not in calls:
                    if call.index > sent:
                        yield whole(call.index)
                        sent = call.index
                    calls[call.index] = [call.id, "", ""]
                if call.function is not None:
                    calls[call.index][1] += call.function.name or ""
                    calls[call.index][2] += call.function.arguments or ""
            if delta.content or (delta.reasoning_content and think is not False):
                message = _message(delta.content or "", delta.reasoning_content, think)
                yield {"model": name, "created_at": now(), "message": message, "done": False}
    if len(calls) > sent:
        yield whole(len(calls))
    assert last is not None and last.timings is not None  # achunks ends with the final chunk
    yield {"model": name, "created_at": now(), "message": _message(""),
           **_final(last.stop_reason, last.timings, n_out, lease)}


async def _completion(llama: Llama, job: Job) -> Completion:
    return collect(await agather_chunks(llama.engine, job), job.prompt)


async def _generate_lines(pieces: AsyncIterator[CompletionChunk], name: str, lease: Leased
                          ) -> AsyncIterator[dict[str, Any]]:
    n_out = 0
    async for piece in pieces:
        n_out += len(piece.tokens)
        if piece.stop_reason is not None:
            assert piece.timings is not None
            if piece.text:
                yield {"model": name, "created_at": now(), "response": piece.text, "done": False}
            yield {"model": name, "created_at": now(), "response": "",
                   **_final(piece.stop_reason, piece.timings, n_out, lease)}
        elif piece.text:
            yield {"model": name, "created_at": now(), "response": piece.text, "done": False}
