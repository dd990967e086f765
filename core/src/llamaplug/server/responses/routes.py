"""/v1/responses: OpenAI's Responses API, translated onto the chat path (a ChatCall, its ChatRun, ChatStream).

The translation both ways is translate.py's: the request becomes the chat request an OpenAI client would send
for it, so the same conversation gives the same text on both APIs; the reply goes back as a response object, or
as its events (response.created ... response.completed, each with a sequence_number). Nothing is
kept (store, default true) in response_store.py's store, which GET/DELETE /v1/responses/{id} read and
previous_response_id chains on. Errors are OpenAI's shape (errors.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import Depends, Query, Request

from ...high.chat_call import start_chat
from ..deps import served_model, token_limit
from ..dialects import RESPONSES
from ..errors import ERROR_RESPONSES, NotFoundError
from ..mcp.loop import asks_for_mcp
from ..mcp.responses import mcp_response
from ..openai.schemas import InputTokens
from ..registry import Served
from ..request_limits import check_messages
from ..response_store import Kept, ResponseStore, chained, conversation_id, page
from ..shared import chat_prompt_tokens
from ..streaming import named_sse, off_loop, unless_gone
from .schemas import DeletedResponse, InputItemList, ResponseObject, ResponsesRequest
from .translate import Reply, as_chat_request, chat_call, events

router = RESPONSES.router()


@router.post("/v1/responses", response_model=ResponseObject, responses=ERROR_RESPONSES)
async def responses(body: ResponsesRequest, request: Request,
                    served: Annotated[Served, Depends(served_model(ResponsesRequest))]) -> Any:
    llama = served.llama
    check_messages(request, body.input if isinstance(body.input, list) else [body.input], "input", body.instructions)
    store, owner = request.app.state.responses, _owner(request)
    body, kept_items = chained(store, owner, body)
    if body.previous_response_id is not None:  # the bounds hold for the whole conversation
        check_messages(request, body.input, "input", body.instructions)
    if store is None:  # --no-responses-store: the response says it is not kept
        body = body.model_copy(update={"store": False})
    chat = as_chat_request(body)
    limit = token_limit(request, chat.max_tokens)

    if asks_for_mcp(chat.tools):  # the server runs the model's MCP calls (server/mcp/responses.py)
        reply = Reply(served, body)
        reply.keep = _keeper(store, owner, body, kept_items)
        return await mcp_response(body, chat, request, served, reply)
    call = chat_call(body, chat, served, limit)
    run = await off_loop(lambda: start_chat(llama, call), request)
    reply = Reply(served, body)
    reply.keep = _keeper(store, owner, body, kept_items)
    if body.stream:
        return named_sse(events(reply, run), reply.error)
    done = await unless_gone(request, run.acompletion())
    items, incomplete = reply.output(run.reply(done).choices[0])
    return reply.finish(reply.response(items, incomplete, done.timings))


@router.post("/v1/responses/input_tokens", response_model=InputTokens, responses=ERROR_RESPONSES)
async def input_tokens(body: ResponsesRequest, request: Request,
                       served: Annotated[Served, Depends(served_model(ResponsesRequest))]) -> InputTokens:
    """llama-server's count of the prompt a request would have (no generation, no context check)."""
    body, _ = chained(request.app.state.responses, _owner(request), body)
    check_messages(request, body.input if isinstance(body.input, list) else [body.input], "input", body.instructions)
    chat = as_chat_request(body)
    return InputTokens(input_tokens=await off_loop(lambda: chat_prompt_tokens(served, chat), request))


# llama-server's spellings without /v1 (one operation each in the OpenAPI document).
router.add_api_route("/responses/input_tokens", input_tokens, methods=["POST"], response_model=InputTokens,
                     responses=ERROR_RESPONSES, include_in_schema=False)
router.add_api_route("/responses", responses, methods=["POST"], response_model=ResponseObject,
                     responses=ERROR_RESPONSES, include_in_schema=False)


@router.get("/v1/responses/{response_id}", response_model=ResponseObject, responses=ERROR_RESPONSES)
async def retrieve(response_id: str, request: Request) -> Any:
    """A kept response (store: true), to the API key that made it."""
    return _kept(request, response_id).response


@router.get("/v1/responses/{response_id}/input_items", response_model=InputItemList, responses=ERROR_RESPONSES)
async def input_items(response_id: str, request: Request, limit: Annotated[int, Query(ge=1, le=100)] = 20,
                      order: Literal["asc", "desc"] = "desc", after: str | None = None) -> InputItemList:
    """The items a kept response answered (with previous_response_id: the whole conversation), OpenAI's pages."""
    items = _kept(request, response_id).items
    return InputItemList(**page(items, limit, order, after, f"response {response_id!r}", "input item"))


@router.delete("/v1/responses/{response_id}", response_model=DeletedResponse, responses=ERROR_RESPONSES)
async def delete(response_id: str, request: Request) -> DeletedResponse:
    store = request.app.state.responses
    if store is None or not await off_loop(lambda: store.delete(_owner(request), response_id), request):
        raise _missing(response_id)
    return DeletedResponse(id=response_id)


def _keeper(store: ResponseStore | None, owner: str, body: ResponsesRequest, kept_items: list[dict[str, Any]]
            ) -> Callable[[dict[str, Any]], None] | None:
    """What keeps a finished response: its row (store: true), and the turn's items added to its conversation
    (OpenAI's: the input items, then the output items)."""
    ident = conversation_id(body)
    if store is None or not (body.store or ident is not None):
        return None

    def keep(response: dict[str, Any]) -> None:
        if body.store:
            store.put(owner, response, kept_items)
        if ident is not None:  # kept_items: this turn's input (response_store.chained)
            store.add_items(owner, ident, kept_items + response["output"])
    return keep


def _owner(request: Request) -> str:
    """Whose responses a request reads: its API key's hash (middleware.KeyGuard), "" on a server without keys."""
    return getattr(request.state, "key_owner", "")


def _kept(request: Request, response_id: str) -> Kept:
    store = request.app.state.responses
    kept = None if store is None else store.get(_owner(request), response_id)
    if kept is None:
        raise _missing(response_id)
    return kept


def _missing(response_id: str) -> NotFoundError:
    return NotFoundError(f"Response with id '{response_id}' not found.", param="response_id")
