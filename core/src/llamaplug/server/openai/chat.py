"""/v1/chat/completions: a reply through the model's chat template, tool calls and response_format included.

The request's translation onto the chat path (and llama-server's fields beside OpenAI's) is translate.py's, its
answer answer.py's; a request with MCP tools goes through the loop of server/mcp/loop.py.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from ..deps import served_model, verbose
from ..dialects import OPENAI
from ..errors import ERROR_RESPONSES
from ..mcp.loop import asks_for_mcp, mcp_chat
from ..registry import Served
from ..request_limits import check_messages
from ..shared import chat_prompt_tokens
from ..streaming import off_loop
from .answer import answer
from .schemas import ChatReply, ChatRequest, InputTokens

router = OPENAI.router()


@router.post("/v1/chat/completions", response_model=ChatReply, responses=ERROR_RESPONSES)
async def chat(body: ChatRequest, request: Request,
               served: Annotated[Served, Depends(served_model(ChatRequest))]) -> Any:
    if asks_for_mcp(body.tools):  # each round of its loop is answered as a request without MCP tools
        return await mcp_chat(body, request, served, answer)
    if verbose(request, body):  # the request's, else serve --verbose (llama-server's debug default)
        body = body.model_copy(update={"verbose": True})
    return await answer(body, request, served)


@router.post("/v1/chat/completions/input_tokens", response_model=InputTokens, responses=ERROR_RESPONSES)
async def input_tokens(body: ChatRequest, request: Request,
                       served: Annotated[Served, Depends(served_model(ChatRequest))]) -> InputTokens:
    """llama-server's count of the prompt a request would have (no generation, no context check)."""
    check_messages(request, body.messages, "messages")
    return InputTokens(input_tokens=await off_loop(lambda: chat_prompt_tokens(served, body), request))


# llama-server's spellings without /v1 (one operation each in the OpenAPI document).
router.add_api_route("/chat/completions/input_tokens", input_tokens, methods=["POST"], response_model=InputTokens,
                     responses=ERROR_RESPONSES, include_in_schema=False)
router.add_api_route("/chat/completions", chat, methods=["POST"], response_model=ChatReply,
                     responses=ERROR_RESPONSES, include_in_schema=False)
