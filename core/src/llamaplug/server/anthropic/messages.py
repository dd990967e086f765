"""/v1/messages: Anthropic's Messages API, translated onto the chat path (a ChatCall, its ChatRun, ChatStream).

The request becomes (translate.py) the chat request an OpenAI client would send for it (system as the
first message, tool_use blocks as an assistant's tool_calls, tool_result blocks as tool
messages, tools' input_schema as their parameters), so the same messages give the same
text on both APIs. The reply goes back as Anthropic's message, or its named events
(message_start, content_block_start/delta/stop, message_delta, message_stop).

Errors are Anthropic's shape ({"type": "error", "error": {"type", "message"}}), with
Anthropic's types for the statuses `as_api_error` gives (dialects.py's ANTHROPIC).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Request

from ...high.chat import ChatSpec, ChatStream
from ...high.chat_call import ChatCall, ChatRun, start_chat
from ...high.completion import CompletionChunk
from ..deps import served_model
from ..dialects import ANTHROPIC
from ..error_docs import error_responses
from ..registry import Served
from ..request_limits import check_messages
from ..shared import chat_prompt_tokens
from ..streaming import named_sse, off_loop, unless_gone
from .schemas import (
    CountTokensRequest,
    ErrorBody,
    MessageResponse,
    MessagesRequest,
    MessageUsage,
    TextOut,
    ThinkingOut,
    TokenCount,
    ToolUseOut,
)
from .translate import ContentBlocks, as_chat_request, sse_event, stop_reason, tool_id, tool_input, usage

router = ANTHROPIC.router()


@router.post("/v1/messages", response_model=MessageResponse,
             responses=error_responses(ErrorBody, (400, 401, 404, 500, 503)))
async def messages(body: MessagesRequest, request: Request,
                   served: Annotated[Served, Depends(served_model(MessagesRequest))]) -> Any:
    llama = served.llama
    check_messages(request, body.messages, "messages", body.system)
    chat = as_chat_request(body)
    one_call = getattr(body.tool_choice, "disable_parallel_tool_use", None)  # Anthropic's parallel_tool_calls
    options = served.chat_options(enable_thinking=body.enable_thinking(),
                                  reasoning_budget_tokens=body.thinking_budget(),
                                  **({"parallel_tool_calls": False} if one_call else {}))
    # an empty list is answered as llama-server does: a reply to the template's own prompt
    call = ChatCall(ChatSpec(chat.messages, tools=chat.tools, tool_choice=chat.tool_choice,
                             response_format=chat.response_format, structured_engine=body.structured_engine,
                             **options),
                    chat.sampling(llama.params.seed, served.sampling), max_tokens=chat.max_tokens, stop=chat.stop,
                    allow_empty=True, model=served.id)
    run = await off_loop(lambda: start_chat(llama, call), request)
    ident = f"msg_{uuid.uuid4().hex[:24]}"
    if body.stream:
        return named_sse(_events(served, run, ident), ANTHROPIC.stream_error)
    done = await unless_gone(request, run.acompletion())
    chat_reply = run.reply(done).choices[0]
    reason, sequence = stop_reason(chat_reply.finish_reason, done.stop_reason, done.stop_string)
    reply = chat_reply.message
    content: list[ThinkingOut | TextOut | ToolUseOut] = \
        [ThinkingOut(thinking=reply.reasoning_content)] if reply.reasoning_content else []
    content += [TextOut(text=reply.content)] if reply.content else []
    content += [ToolUseOut(id=tool_id(c.id), name=c.function.name, input=tool_input(c.function.arguments))
                for c in reply.tool_calls or []]
    return MessageResponse(id=ident, model=served.id, content=content, stop_reason=reason, stop_sequence=sequence,
                           usage=usage(done.timings))


@router.post("/v1/messages/count_tokens", response_model=TokenCount,
             responses=error_responses(ErrorBody, (400, 401, 404, 503)))
async def count_tokens(body: CountTokensRequest, request: Request,
                       served: Annotated[Served, Depends(served_model(CountTokensRequest))]) -> TokenCount:
    """The prompt's tokens, as the chat path renders it (llama-server's count: no generation, no context check)."""
    check_messages(request, body.messages, "messages", body.system)
    chat = as_chat_request(body)
    return TokenCount(input_tokens=await off_loop(lambda: chat_prompt_tokens(served, chat), request))


async def _events(served: Served, run: ChatRun, ident: str) -> AsyncIterator[tuple[str, str]]:
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
