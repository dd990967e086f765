"""The chat completion a ChatRequest gets: its ChatCall (translate.py) started, the reply whole or streamed.

/v1/chat/completions answers through it (chat.py), and the MCP loop asks each of its rounds of it (server/mcp/),
so that no module reaches into a route for it.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from ...high.chat_call import start_chat
from ..deps import token_limit
from ..registry import Served
from ..request_limits import check_messages
from ..shared import generation_settings, verbose_result
from ..streaming import off_loop, sse, unless_gone
from .schemas import ChatRequest
from .translate import chat_call, chat_events, chat_reply, check_fields


async def answer(body: ChatRequest, request: Request, served: Served) -> Any:
    """The reply to `body` (no MCP tools): a ChatReply, its stream, or with `verbose` the reply and __verbose."""
    llama = served.llama
    check_fields(body)
    check_messages(request, body.messages, "messages")
    limit = token_limit(request, body.max_completion_tokens if body.max_completion_tokens is not None
                        else body.max_tokens)
    call = chat_call(body, served, limit)
    run = await off_loop(lambda: start_chat(llama, call), request)
    # llama-server's debug field: each reply as /completion would write it
    settings = generation_settings(call.sampler, -1 if limit is None else limit, body.stop, body.stream,
                                   body.ignore_eos) \
        if body.verbose else None
    if body.stream:
        return sse(chat_events(served, run, body, settings))
    done = await unless_gone(request, run.acompletions())
    reply = chat_reply(served, run, done)
    if settings is None:
        return reply
    debug = verbose_result(served, 0, done[0], run.plan.params["prompt"], settings)
    return JSONResponse({**jsonable_encoder(reply), "__verbose": debug})
