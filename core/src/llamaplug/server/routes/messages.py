"""/v1/messages: Anthropic's Messages API, translated onto the chat path (chat_job, as_chat, ChatStream).

The request becomes the chat request an OpenAI client would send for it (system as the
first message, tool_use blocks as an assistant's tool_calls, tool_result blocks as tool
messages, tools' input_schema as their parameters), so the same messages give the same
text on both APIs. The reply goes back as Anthropic's message, or its named events
(message_start, content_block_start/delta/stop, message_delta, message_stop).

Errors are Anthropic's shape ({"type": "error", "error": {"type", "message"}}), with
Anthropic's types for the statuses `as_api_error` gives (route_errors.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from ...errors import LlamaError
from ...high.chat import ChatStream, as_chat
from ...high.completion import CompletionChunk, CompletionTimings, StopReason
from ...high.engine import Job
from ...high.events import achunks, agather_chunks
from ...high.requests import chat_job, collect
from ..anthropic_schemas import (
    ErrorBody,
    ErrorDetail,
    ImageBlock,
    MessageResponse,
    MessagesRequest,
    MessageUsage,
    TextBlock,
    TextOut,
    ToolResultBlock,
    ToolUseBlock,
    ToolUseOut,
)
from ..deps import served_model
from ..errors import ApiError, as_api_error
from ..registry import Served
from ..route_errors import TranslatedRoute
from ..schemas import ChatRequest
from ..streaming import named_sse, unless_gone

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"}


def error_body(exc: ApiError) -> ErrorBody:
    kind = _ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return ErrorBody(error=ErrorDetail(type=kind, message=str(exc)))


class AnthropicRoute(TranslatedRoute):
    """A route whose errors, a body that does not fit included, are Anthropic's shape."""

    def shape(self, error: ApiError) -> Response:
        return JSONResponse(error_body(error).model_dump(), status_code=error.status)


router = APIRouter(route_class=AnthropicRoute)


@router.post("/v1/messages", response_model=MessageResponse,
             responses={code: {"model": ErrorBody} for code in (400, 401, 404, 503)})
async def messages(body: MessagesRequest, request: Request,
                   served: Annotated[Served, Depends(served_model(MessagesRequest))]) -> Any:
    llama = served.llama
    chat = as_chat_request(body)
    sampler = chat.sampling(llama.params.seed, served.sampling).build_chain(llama.model)
    job, kind = chat_job(llama, chat.messages, chat.max_tokens, sampler, chat.stop, chat.tools, chat.tool_choice,
                         chat.response_format, own_sampler=True)
    ident = f"msg_{uuid.uuid4().hex[:24]}"
    if body.stream:
        return named_sse(_events(served, job, kind, ident), _stream_error)
    done = collect(await unless_gone(request, agather_chunks(llama.engine, job)), job.prompt)
    chat_reply = as_chat(done, served.id, kind).choices[0]
    reason, sequence = _stop(chat_reply.finish_reason, done.stop_reason,
                             lambda: _matched_stop(served, done.text, done.tokens, job.stops))
    reply = chat_reply.message
    content: list[TextOut | ToolUseOut] = [TextOut(text=reply.content)] if reply.content else []
    content += [ToolUseOut(id=_tool_id(c.id), name=c.function.name, input=_tool_input(c.function.arguments))
                for c in reply.tool_calls or []]
    return MessageResponse(id=ident, model=served.id, content=content, stop_reason=reason, stop_sequence=sequence,
                           usage=_usage(done.timings, len(done.tokens)))


def as_chat_request(body: MessagesRequest) -> ChatRequest:
    """The chat request that asks for what `body` asks for."""
    messages: list[dict[str, Any]] = []
    if body.system is not None:
        text = body.system if isinstance(body.system, str) else "\n".join(b.text for b in body.system)
        messages.append({"role": "system", "content": text})
    for i, message in enumerate(body.messages):
        messages += _chat_messages(message.role, message.content, f"messages[{i}]")
    tools = None if body.tools is None else [
        {"type": "function", "function": {"name": t.name, "parameters": t.input_schema,
                                          **({"description": t.description} if t.description else {})}}
        for t in body.tools]
    choice = body.tool_choice
    tool_choice: str | dict[str, Any] | None = None
    if choice is not None:
        tool_choice = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type) or \
            {"type": "function", "function": {"name": getattr(choice, "name", None)}}
    form = body.output_config.format if body.output_config is not None else None
    return ChatRequest(model=body.model, messages=messages, max_tokens=body.max_tokens, temperature=body.temperature,
                       top_p=body.top_p, top_k=body.top_k, stop=body.stop_sequences, tools=tools,
                       tool_choice=tool_choice, response_format=None if form is None else
                       {"type": "json_schema", "json_schema": {"schema": form.json_schema}})


def _chat_messages(role: str, content: str | list[Any], where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool results first (each a tool message), then the rest."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        if isinstance(block, ToolUseBlock):
            if role != "assistant":
                raise ApiError(400, f"{where}.content[{j}]: tool_use blocks belong to assistant messages",
                               param=f"{where}.content[{j}]")
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
        elif isinstance(block, ToolResultBlock):
            if role != "user":
                raise ApiError(400, f"{where}.content[{j}]: tool_result blocks belong to user messages",
                               param=f"{where}.content[{j}]")
            given = block.content
            results.append({"role": "tool", "tool_call_id": block.tool_use_id,
                            "content": given if isinstance(given, str) else [_part(b) for b in given]})
        else:
            parts.append(_part(block))
    if parts or calls:
        message: dict[str, Any] = {"role": role, "content": parts or None}
        if calls:
            message["tool_calls"] = calls
        results.append(message)
    return results


def _part(block: TextBlock | ImageBlock) -> dict[str, Any]:
    """A text or image block as the chat message part an OpenAI client sends for it."""
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    source = block.source
    url = source.url if source.type == "url" else f"data:{source.media_type};base64,{source.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as Anthropic's `input` object (a model that wrote a non-object has it under "value")."""
    given = json.loads(arguments)
    return given if isinstance(given, dict) else {"value": given}


def _stop(finish: str | None, reason: StopReason | None, which: Callable[[], str | None]) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a chat reply's finish_reason (the engine's `reason`)."""
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if reason == StopReason.STOP_SEQUENCE:
        return "stop_sequence", which()
    return "end_turn", None


def _matched_stop(served: Served, text: str, tokens: list[int], stops: list[str]) -> str | None:
    """The stop sequence that ended a reply: the one found first in its tokens' text (as the engine cuts)."""
    whole = served.llama.model.detokenize(tokens) if tokens else text
    found = [(at, s) for s in stops if s and (at := whole.find(s, max(0, len(text) - len(s)))) >= 0]
    return min(found)[1] if found else None


def _usage(timings: CompletionTimings, n_out: int) -> MessageUsage:
    """Anthropic's usage: input_tokens are the prompt tokens decoded, cache_read_input_tokens those reused."""
    return MessageUsage(input_tokens=timings.prompt_tokens - timings.cached_tokens, output_tokens=n_out,
                        cache_read_input_tokens=timings.cached_tokens)


def _event(payload: dict[str, Any]) -> tuple[str, str]:
    return payload["type"], json.dumps(payload, ensure_ascii=False)


async def _events(served: Served, job: Job, kind: str | None, ident: str) -> AsyncIterator[tuple[str, str]]:
    start = MessageResponse(id=ident, model=served.id, content=[], stop_reason=None, stop_sequence=None,
                            usage=MessageUsage(input_tokens=job.n_prompt, output_tokens=0))
    yield _event({"type": "message_start", "message": start.model_dump()})
    yield _event({"type": "ping"})
    stream = ChatStream(served.id, kind)
    index, text_open = 0, False
    texts: list[str] = []
    tokens: list[int] = []
    last: CompletionChunk | None = None
    finish: str | None = None
    async for piece in achunks(served.llama.engine, job):
        texts.append(piece.text)
        tokens += piece.tokens
        last = piece
        for out in stream.feed(piece):
            delta = out.choices[0].delta
            finish = out.choices[0].finish_reason or finish
            if delta.content:
                if not text_open:
                    yield _event({"type": "content_block_start", "index": index,
                                  "content_block": {"type": "text", "text": ""}})
                    text_open = True
                yield _event({"type": "content_block_delta", "index": index,
                              "delta": {"type": "text_delta", "text": delta.content}})
            if (delta.tool_calls or out.choices[0].finish_reason) and text_open:
                yield _event({"type": "content_block_stop", "index": index})
                index, text_open = index + 1, False
            for call in delta.tool_calls or []:
                yield _event({"type": "content_block_start", "index": index, "content_block": {
                    "type": "tool_use", "id": _tool_id(call.id), "name": call.function.name, "input": {}}})
                yield _event({"type": "content_block_delta", "index": index, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(_tool_input(call.function.arguments))}})
                yield _event({"type": "content_block_stop", "index": index})
                index += 1
    assert last is not None and last.timings is not None  # achunks ends with the final chunk
    text = "".join(texts)
    reason, sequence = _stop(finish, last.stop_reason, lambda: _matched_stop(served, text, tokens, job.stops))
    yield _event({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                  "usage": _usage(last.timings, len(tokens)).model_dump()})
    yield _event({"type": "message_stop"})


def _stream_error(exc: LlamaError) -> tuple[str, str]:
    return "error", error_body(as_api_error(exc)).model_dump_json()
