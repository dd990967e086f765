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
from typing import Annotated, Any

from fastapi import Depends, Request

from ...high.chat_call import start_chat
from ..deps import served_model
from ..dialects import ANTHROPIC
from ..error_docs import error_responses
from ..registry import Served
from ..request_limits import check_messages
from ..shared import chat_prompt_tokens
from ..streaming import named_sse, off_loop, unless_gone
from .schemas import CountTokensRequest, ErrorBody, MessageResponse, MessagesRequest, TokenCount
from .translate import as_chat_request, chat_call, events, message_response

router = ANTHROPIC.router()


@router.post("/v1/messages", response_model=MessageResponse,
             responses=error_responses(ErrorBody, (400, 401, 404, 500, 503)))
async def messages(body: MessagesRequest, request: Request,
                   served: Annotated[Served, Depends(served_model(MessagesRequest))]) -> Any:
    llama = served.llama
    check_messages(request, body.messages, "messages", body.system)
    chat = as_chat_request(body)
    call = chat_call(body, chat, served)
    run = await off_loop(lambda: start_chat(llama, call), request)
    ident = f"msg_{uuid.uuid4().hex[:24]}"
    if body.stream:
        return named_sse(events(served, run, ident), ANTHROPIC.stream_error)
    done = await unless_gone(request, run.acompletion())
    return message_response(served, run, done, ident)


@router.post("/v1/messages/count_tokens", response_model=TokenCount,
             responses=error_responses(ErrorBody, (400, 401, 404, 503)))
async def count_tokens(body: CountTokensRequest, request: Request,
                       served: Annotated[Served, Depends(served_model(CountTokensRequest))]) -> TokenCount:
    """The prompt's tokens, as the chat path renders it (llama-server's count: no generation, no context check)."""
    check_messages(request, body.messages, "messages", body.system)
    chat = as_chat_request(body)
    return TokenCount(input_tokens=await off_loop(lambda: chat_prompt_tokens(served, chat), request))
