"""/v1/conversations: OpenAI's Conversations API, the items a response's `conversation` reads before its input and
adds its turn to (the Agents SDK's `conversation_id` and OpenAIConversationsSession use them).

Kept in response_store.py's store beside the responses, under the same rules: per API key (another key's
conversation is a 404, as one that does not exist), bounded by age and size, none with --no-responses-store.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Query, Request

from ..dialects import RESPONSES
from ..errors import ERROR_RESPONSES, BadRequestError, NotFoundError
from ..response_store import ResponseStore, as_items, page
from ..streaming import off_loop
from .schemas import (
    Conversation,
    ConversationItems,
    ConversationRequest,
    ConversationUpdate,
    DeletedConversation,
    InputItemList,
)

router = RESPONSES.router()


@router.post("/v1/conversations", response_model=Conversation, responses=ERROR_RESPONSES)
async def create(request: Request, body: ConversationRequest | None = None) -> Any:
    body = body or ConversationRequest()
    store, owner = _store(request), _owner(request)
    items = as_items(body.items or [])
    return await off_loop(lambda: store.create_conversation(owner, items, body.metadata or {}), request)


@router.get("/v1/conversations/{conversation_id}", response_model=Conversation, responses=ERROR_RESPONSES)
async def retrieve(conversation_id: str, request: Request) -> Any:
    return await _conversation(request, conversation_id)


@router.post("/v1/conversations/{conversation_id}", response_model=Conversation, responses=ERROR_RESPONSES)
async def update(conversation_id: str, body: ConversationUpdate, request: Request) -> Any:
    return await _conversation(request, conversation_id, body.metadata)


@router.delete("/v1/conversations/{conversation_id}", response_model=DeletedConversation,
               responses=ERROR_RESPONSES)
async def delete(conversation_id: str, request: Request) -> DeletedConversation:
    store, owner = _store(request), _owner(request)
    if not await off_loop(lambda: store.delete_conversation(owner, conversation_id), request):
        raise _missing(conversation_id)
    return DeletedConversation(id=conversation_id)


@router.get("/v1/conversations/{conversation_id}/items", response_model=InputItemList, responses=ERROR_RESPONSES)
async def list_items(conversation_id: str, request: Request, limit: Annotated[int, Query(ge=1, le=100)] = 20,
                     order: Literal["asc", "desc"] = "desc", after: str | None = None) -> Any:
    """The conversation's items, OpenAI's pages (newest first unless order=asc)."""
    items = await _items(request, conversation_id)
    return page(items, limit, order, after, f"conversation {conversation_id!r}")


@router.post("/v1/conversations/{conversation_id}/items", response_model=InputItemList, responses=ERROR_RESPONSES)
async def add_items(conversation_id: str, body: ConversationItems, request: Request) -> Any:
    """`items` after the conversation's others; the list of them as kept (with their ids)."""
    store, owner, items = _store(request), _owner(request), as_items(body.items)
    if not await off_loop(lambda: store.add_items(owner, conversation_id, items), request):
        raise _missing(conversation_id)
    return page(items, len(items), "asc", None, f"conversation {conversation_id!r}")


@router.get("/v1/conversations/{conversation_id}/items/{item_id}", responses=ERROR_RESPONSES)
async def retrieve_item(conversation_id: str, item_id: str, request: Request) -> dict[str, Any]:
    item = next((i for i in await _items(request, conversation_id) if i["id"] == item_id), None)
    if item is None:
        raise NotFoundError(f"Item with id '{item_id}' not found.", param="item_id")
    return item


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}", response_model=Conversation,
               responses=ERROR_RESPONSES)
async def delete_item(conversation_id: str, item_id: str, request: Request) -> Any:
    """OpenAI's: the conversation the item was deleted from."""
    store, owner = _store(request), _owner(request)
    conversation = await _conversation(request, conversation_id)
    if not await off_loop(lambda: store.delete_item(owner, conversation_id, item_id), request):
        raise NotFoundError(f"Item with id '{item_id}' not found.", param="item_id")
    return conversation


def _store(request: Request) -> ResponseStore:
    store = request.app.state.responses
    if store is None:
        raise BadRequestError("this server keeps no conversations (--no-responses-store)", param="conversation_id",
                              code="unsupported_parameter")
    return store


def _owner(request: Request) -> str:
    """Whose conversations a request reads: its API key's hash (middleware.KeyGuard), "" without keys."""
    return getattr(request.state, "key_owner", "")


async def _conversation(request: Request, ident: str, metadata: dict[str, str] | None = None) -> dict[str, Any]:
    store, owner = _store(request), _owner(request)
    found = await off_loop(lambda: store.conversation(owner, ident, metadata), request)
    if found is None:
        raise _missing(ident)
    return found


async def _items(request: Request, ident: str) -> list[dict[str, Any]]:
    store, owner = _store(request), _owner(request)
    items = await off_loop(lambda: store.conversation_items(owner, ident), request)
    if items is None:
        raise _missing(ident)
    return items


def _missing(ident: str) -> NotFoundError:
    return NotFoundError(f"Conversation with id '{ident}' not found.", param="conversation_id")
