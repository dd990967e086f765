"""Anthropic's Messages wire format and the chat path's: a request as the chat request an OpenAI client would send
for it and its ChatCall, and the reply (whole or streamed) as Anthropic's content blocks, stop reason and usage."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from ...high.chat import ChatSpec, ChatStream
from ...high.chat_call import ChatCall, ChatRun
from ...high.completion import Completion, CompletionChunk, CompletionTimings, StopReason
from ..errors import BadRequestError
from ..openai.schemas import ChatRequest
from ..registry import Served
from .schemas import (
    ImageBlock,
    MessageResponse,
    MessagesRequest,
    MessageUsage,
    RedactedThinkingBlock,
    TextBlock,
    TextOut,
    ThinkingBlock,
    ThinkingOut,
    ToolResultBlock,
    ToolUseBlock,
    ToolUseOut,
)


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
    # (a chat request needs a message; llama-server takes none at all: checked with one, then without)
    chat = ChatRequest(model=body.model, messages=messages or [{"role": "user", "content": ""}],
                       max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                       stop=body.stop_sequences, tools=tools, tool_choice=tool_choice,
                       response_format=None if form is None else
                       {"type": "json_schema", "json_schema": {"schema": form.json_schema}})
    return chat if messages else chat.model_copy(update={"messages": []})


def _chat_messages(role: str, content: str | list[Any], where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool results first (each a tool message), then the rest."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, block in enumerate(content):
        if isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, RedactedThinkingBlock):
            continue
        elif isinstance(block, ToolUseBlock):
            if role != "assistant":
                raise BadRequestError(f"{where}.content[{j}]: tool_use blocks belong to assistant messages",
                                      param=f"{where}.content[{j}]")
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
        elif isinstance(block, ToolResultBlock):
            if role != "user":
                raise BadRequestError(f"{where}.content[{j}]: tool_result blocks belong to user messages",
                                      param=f"{where}.content[{j}]")
            given = block.content
            results.append({"role": "tool", "tool_call_id": block.tool_use_id,
                            "content": given if isinstance(given, str) else [_part(b) for b in given]})
        else:
            parts.append(_part(block))
    if parts or calls or reasoning:
        message: dict[str, Any] = {"role": role, "content": parts or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        if reasoning:
            message["reasoning_content"] = "\n".join(reasoning)
        results.append(message)
    return results


def _part(block: TextBlock | ImageBlock) -> dict[str, Any]:
    """A text or image block as the chat message part an OpenAI client sends for it."""
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    source = block.source
    url = source.url if source.type == "url" else f"data:{source.media_type};base64,{source.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def tool_input(arguments: str, cut: bool = False) -> dict[str, Any]:
    """A call's arguments as Anthropic's `input` object (a model that wrote a non-object has it under "value").
    `cut`: the reply ended at max_tokens, where arguments that do not parse yet are the empty object (Anthropic's
    tool_use block cut by max_tokens: the block is there, stop_reason "max_tokens" says it is incomplete)."""
    try:
        given = json.loads(arguments)
    except json.JSONDecodeError:
        if not cut:
            raise
        return {}
    return given if isinstance(given, dict) else {"value": given}


def stop_reason(finish: str | None, reason: StopReason | None, matched: str | None) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a chat reply's finish_reason (the engine's `reason`)."""
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if reason == StopReason.STOP_SEQUENCE:
        return "stop_sequence", matched
    return "end_turn", None


def usage(timings: CompletionTimings) -> MessageUsage:
    """Anthropic's usage: input_tokens are the prompt tokens decoded, cache_read_input_tokens those reused,
    output_tokens those sampled (the end-of-generation token too, as llama-server counts them)."""
    return MessageUsage(input_tokens=timings.prompt_tokens - timings.cached_tokens,
                        output_tokens=timings.predicted_tokens,
                        cache_read_input_tokens=timings.cached_tokens)


def sse_event(payload: dict[str, Any]) -> tuple[str, str]:
    return payload["type"], json.dumps(payload, ensure_ascii=False)


class ContentBlocks:
    """Anthropic's content blocks of a streamed reply: thinking, text and tool_use blocks opened and closed as
    the chat deltas arrive (a call's arguments go out as input_json_delta pieces as they are generated)."""

    def __init__(self) -> None:
        self.index, self.open = 0, None  # the open block: "thinking", "text", or a tool call's index

    def _start(self, kind: Any, block: dict[str, Any]) -> list[tuple[str, str]]:
        out = self.close()
        self.open = kind
        return out + [sse_event({"type": "content_block_start", "index": self.index, "content_block": block})]

    def close(self) -> list[tuple[str, str]]:
        if self.open is None:
            return []
        self.open = None
        self.index += 1
        return [sse_event({"type": "content_block_stop", "index": self.index - 1})]

    def _delta(self, delta: dict[str, Any]) -> tuple[str, str]:
        return sse_event({"type": "content_block_delta", "index": self.index, "delta": delta})

    def feed(self, delta: Any) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if delta.reasoning_content:
            if self.open != "thinking":
                out += self._start("thinking", {"type": "thinking", "thinking": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": delta.reasoning_content}))
        if delta.content:
            if self.open != "text":
                out += self._start("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": delta.content}))
        for call in delta.tool_calls or []:
            if call.id is not None:
                out += self._start(("tool", call.index), {"type": "tool_use", "id": tool_id(call.id),
                                                          "name": call.function.name if call.function else "",
                                                          "input": {}})
            if call.function is not None and call.function.arguments and self.open == ("tool", call.index):
                out.append(self._delta({"type": "input_json_delta", "partial_json": call.function.arguments}))
        return out


def chat_call(body: MessagesRequest, chat: ChatRequest, served: Served) -> ChatCall:
    """The ChatCall of `body`, whose chat request is `chat` (as_chat_request)."""
    llama = served.llama
    one_call = getattr(body.tool_choice, "disable_parallel_tool_use", None)  # Anthropic's parallel_tool_calls
    options = served.chat_options(enable_thinking=body.enable_thinking(),
                                  reasoning_budget_tokens=body.thinking_budget(),
                                  **({"parallel_tool_calls": False} if one_call else {}))
    # an empty list is answered as llama-server does: a reply to the template's own prompt
    return ChatCall(ChatSpec(chat.messages, tools=chat.tools, tool_choice=chat.tool_choice,
                             response_format=chat.response_format, structured_engine=body.structured_engine,
                             **options),
                    chat.sampling(llama.params.seed, served.sampling), max_tokens=chat.max_tokens, stop=chat.stop,
                    allow_empty=True, model=served.id)


def message_response(served: Served, run: ChatRun, done: Completion, ident: str) -> MessageResponse:
    """Anthropic's message for `run`'s finished reply `done`: thinking, text and tool_use blocks, the stop."""
    chat_reply = run.reply(done).choices[0]
    reason, sequence = stop_reason(chat_reply.finish_reason, done.stop_reason, done.stop_string)
    reply = chat_reply.message
    content: list[ThinkingOut | TextOut | ToolUseOut] = \
        [ThinkingOut(thinking=reply.reasoning_content)] if reply.reasoning_content else []
    content += [TextOut(text=reply.content)] if reply.content else []
    content += [ToolUseOut(id=tool_id(c.id), name=c.function.name,
                           input=tool_input(c.function.arguments, cut=reason == "max_tokens"))
                for c in reply.tool_calls or []]
    return MessageResponse(id=ident, model=served.id, content=content, stop_reason=reason, stop_sequence=sequence,
                           usage=usage(done.timings))


async def events(served: Served, run: ChatRun, ident: str) -> AsyncIterator[tuple[str, str]]:
    """Anthropic's named events of `run`'s streamed reply (message_start ... message_stop)."""
    start = MessageResponse(id=ident, model=served.id, content=[], stop_reason=None, stop_sequence=None,
                            usage=MessageUsage(input_tokens=run.job.n_prompt, output_tokens=0))
    yield sse_event({"type": "message_start", "message": start.model_dump()})
    yield sse_event({"type": "ping"})
    stream = ChatStream(served.id, run.plan)
    blocks = ContentBlocks()
    last: CompletionChunk | None = None
    finish: str | None = None
    async for piece in run.achunks():
        last = piece
        for out in stream.feed(piece):
            finish = out.choices[0].finish_reason or finish
            for event in blocks.feed(out.choices[0].delta):
                yield event
    for event in blocks.close():
        yield event
    assert last is not None and last.timings is not None  # achunks ends with the final chunk
    reason, sequence = stop_reason(finish, last.stop_reason, last.stop_string)
    yield sse_event({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                  "usage": usage(last.timings).model_dump()})
    yield sse_event({"type": "message_stop"})
