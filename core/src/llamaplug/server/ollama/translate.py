"""Ollama's wire format and the chat path's: /api/chat and /api/generate requests as their ChatCall (Ollama's
messages as the OpenAI messages the chat path takes), and the replies as Ollama's objects and NDJSON lines (thinking,
tool calls with their arguments as objects, done_reason, the counts and durations in nanoseconds)."""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from ...high.chat import ChatSpec, ChatStream
from ...high.chat_call import ChatCall, ChatRun
from ...high.completion import Completion, CompletionChunk, CompletionTimings, StopReason
from ..errors import BadRequestError
from ..registry import Served
from .common import Leased, now
from .schemas import ChatRequest, GenerateRequest, Message, Sampling, response_format


def think_options(served: Served, think: Any) -> dict[str, Any]:
    """The chat options of Ollama's think: true/false switches the template's thinking, a level is its reasoning
    effort."""
    return served.chat_options(enable_thinking=think if isinstance(think, bool) else None,
                               reasoning_effort=think if isinstance(think, str) else None)


def chat_call(body: ChatRequest, served: Served, sampling: Sampling, limit: int | None,
              options: dict[str, Any]) -> ChatCall:
    """The ChatCall of an /api/chat request (`options`: its think_options)."""
    spec = ChatSpec(chat_messages(body.messages), tools=body.tools or None, tool_choice=body.tool_choice,
                    response_format=response_format(body.format), structured_engine=body.structured_engine,
                    **options)
    return ChatCall(spec, sampling.params, max_tokens=limit, stop=sampling.stop, model=served.id)


def generate_call(body: GenerateRequest, served: Served, sampling: Sampling, limit: int | None,
                  form: dict[str, Any] | None) -> ChatCall:
    """The ChatCall of an /api/generate request through the chat template: `system` and one user message."""
    messages = [Message(role="system", content=body.system)] if body.system else []
    messages.append(Message(role="user", content=body.prompt or "", images=body.images))
    return ChatCall(ChatSpec(chat_messages(messages), response_format=form,
                             structured_engine=body.structured_engine, **served.chat_options()),
                    sampling.params, max_tokens=limit, stop=sampling.stop, model=served.id)


def chat_reply(body: ChatRequest, run: ChatRun, done: Completion, lease: Leased) -> dict[str, Any]:
    """An /api/chat reply, whole: the message (thinking, calls with their arguments as objects) and the counts."""
    reply = run.reply(done).choices[0].message
    message = reply_message(reply.content or "", reply.reasoning_content, body.think)
    if reply.tool_calls:
        message["tool_calls"] = [tool_call(i, c.id, c.function.name, c.function.arguments)
                                 for i, c in enumerate(reply.tool_calls)]
    return {"model": body.model, "created_at": now(), "message": message,
            **final_fields(done.stop_reason, done.timings, len(done.tokens), lease)}


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


def reply_message(content: str, thinking: str | None = None, think: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking and think is not False:
        message["thinking"] = thinking
    return message


def tool_call(index: int, ident: str | None, name: str, arguments: str) -> dict[str, Any]:
    """A tool call as Ollama's: the arguments an object (a model that wrote a non-object has it under "value")."""
    try:
        given = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        given = {"value": arguments}
    args = given if isinstance(given, dict) else {"value": given}
    return {**({"id": ident} if ident else {}), "function": {"index": index, "name": name, "arguments": args}}


def _done_reason(reason: StopReason | None) -> str:
    return "length" if reason in (StopReason.MAX_TOKENS, StopReason.CONTEXT_FULL) else "stop"


def final_fields(reason: StopReason | None, timings: CompletionTimings, n_out: int, lease: Leased) -> dict[str, Any]:
    """The last object's fields: done, done_reason, the counts and the durations (nanoseconds)."""
    return {"done": True, "done_reason": _done_reason(reason),
            "total_duration": time.perf_counter_ns() - lease.started, "load_duration": lease.load_ns,
            "prompt_eval_count": timings.prompt_tokens, "prompt_eval_duration": int(timings.prompt_ms * 1e6),
            "eval_count": n_out, "eval_duration": int(timings.predicted_ms * 1e6)}


async def chat_lines(served: Served, run: ChatRun, name: str, lease: Leased, think: Any = None
                      ) -> AsyncIterator[dict[str, Any]]:
    """Ollama's stream: thinking and content as they come; a tool call whole (Ollama's clients read each
    call as one object), sent once its arguments are complete (the next call begins, or the reply ends)."""
    stream = ChatStream(served.id, run.plan)
    last: CompletionChunk | None = None
    n_out = 0
    calls: dict[int, list[Any]] = {}  # index -> [id, name, arguments so far]
    sent = 0

    def whole(upto: int) -> dict[str, Any]:
        message = reply_message("")
        message["tool_calls"] = [tool_call(i, *calls[i]) for i in range(sent, upto)]
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
                message = reply_message(delta.content or "", delta.reasoning_content, think)
                yield {"model": name, "created_at": now(), "message": message, "done": False}
    if len(calls) > sent:
        yield whole(len(calls))
    assert last is not None and last.timings is not None  # achunks ends with the final chunk
    yield {"model": name, "created_at": now(), "message": reply_message(""),
           **final_fields(last.stop_reason, last.timings, n_out, lease)}


async def generate_lines(pieces: AsyncIterator[CompletionChunk], name: str, lease: Leased
                          ) -> AsyncIterator[dict[str, Any]]:
    n_out = 0
    async for piece in pieces:
        n_out += len(piece.tokens)
        if piece.stop_reason is not None:
            assert piece.timings is not None
            if piece.text:
                yield {"model": name, "created_at": now(), "response": piece.text, "done": False}
            yield {"model": name, "created_at": now(), "response": "",
                   **final_fields(piece.stop_reason, piece.timings, n_out, lease)}
        elif piece.text:
            yield {"model": name, "created_at": now(), "response": piece.text, "done": False}
