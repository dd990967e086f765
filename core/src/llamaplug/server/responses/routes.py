"""/v1/responses: OpenAI's Responses API, translated onto the chat path (a ChatCall, its ChatRun, ChatStream).

The request becomes the chat request an OpenAI client would send for it (instructions
as the first system message, function_call items as an assistant's tool_calls,
function_call_output items as tool messages, text.format as response_format), so the
same conversation gives the same text on both APIs. The reply goes back as a response
object (a message item with output_text, function_call items), or as its events
(response.created ... response.completed, each with a sequence_number). Nothing is
kept (store, default true) in response_store.py's store, which GET/DELETE /v1/responses/{id} read and
previous_response_id chains on. Errors are OpenAI's shape (errors.py).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

from fastapi import Depends, Query, Request

from ...errors import LlamaError
from ...high.chat import ChatSpec, ChatStream
from ...high.chat_call import ChatCall, ChatRun, start_chat
from ...high.chat_output import ToolCall
from ...high.completion import CompletionTimings
from ..deps import served_model, token_limit
from ..dialects import RESPONSES, named_event
from ..errors import ERROR_RESPONSES, BadRequestError, NotFoundError
from ..mcp.loop import asks_for_mcp
from ..mcp.responses import mcp_response, mcp_tool
from ..openai.schemas import ChatRequest, InputTokens
from ..registry import Served
from ..request_fields import progress
from ..request_limits import check_messages
from ..response_store import Kept, ResponseStore, chained, conversation_id
from ..shared import chat_prompt_tokens, so_far, timings
from ..streaming import named_sse, off_loop, unless_gone
from .schemas import (
    DeletedResponse,
    FunctionCallItem,
    FunctionCallOut,
    FunctionCallOutputItem,
    IncompleteDetails,
    InputImage,
    InputItemList,
    InputTokensDetails,
    McpToolSpec,
    OutputMessage,
    OutputTextPart,
    ReasoningOut,
    ReasoningTextPart,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)

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
    effort = body.reasoning.effort if body.reasoning is not None else None

    if asks_for_mcp(chat.tools):  # the server runs the model's MCP calls (server/mcp/responses.py)
        reply = _Reply(served, body)
        reply.keep = _keeper(store, owner, body, kept_items)
        return await mcp_response(body, chat, request, served, reply)
    options = served.chat_options(reasoning_effort=effort, parallel_tool_calls=body.parallel_tool_calls)
    call = ChatCall(ChatSpec(chat.messages, tools=chat.tools, tool_choice=chat.tool_choice,
                             response_format=chat.response_format, structured_engine=body.structured_engine,
                             **options),
                    chat.sampling(llama.params.seed, served.sampling), max_tokens=limit, model=served.id)
    run = await off_loop(lambda: start_chat(llama, call), request)
    reply = _Reply(served, body)
    reply.keep = _keeper(store, owner, body, kept_items)
    if body.stream:
        return named_sse(_events(reply, run), reply.error)
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
    items = items[::-1] if order == "desc" else items
    if after is not None:
        start = next((i + 1 for i, item in enumerate(items) if item.get("id") == after), None)
        if start is None:
            raise BadRequestError(f"no input item {after!r} in response {response_id!r}", param="after")
        items = items[start:]
    page = items[:limit]
    return InputItemList(data=page, first_id=page[0]["id"] if page else None,
                         last_id=page[-1]["id"] if page else None, has_more=len(items) > limit)


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


def as_chat_request(body: ResponsesRequest) -> ChatRequest:
    """The chat request that asks for what `body` asks for."""
    messages: list[dict[str, Any]] = []
    if body.instructions is not None:
        messages.append({"role": "system", "content": body.instructions})
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else []
    for item in [] if isinstance(body.input, str) else body.input:
        if isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if items and items[-1]["role"] == "assistant":  # calls after the assistant's text: one chat message
                items[-1].setdefault("tool_calls", []).append(call)
            else:
                items.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            items.append({"role": "tool", "tool_call_id": item.call_id, "content": _content(item.output)})
        else:
            items.append({"role": item.role, "content": _content(item.content)})
    messages += items
    # OpenAI takes an empty list for no tools (the Agents SDK sends one for an agent without tools)
    tools = None if not body.tools else [
        mcp_tool(t) if isinstance(t, McpToolSpec) else
        {"type": "function", "function": {"name": t.name, "parameters": t.parameters or {"type": "object"},
                                          **({"description": t.description} if t.description else {})}}
        for t in body.tools]
    choice = body.tool_choice
    tool_choice = choice if choice is None or isinstance(choice, str) else \
        {"type": "function", "function": {"name": choice.name}}
    return ChatRequest(model=body.model, messages=messages, max_tokens=body.max_output_tokens,
                       temperature=body.temperature, top_p=body.top_p, tools=tools, tool_choice=tool_choice,
                       response_format=_response_format(body))


def _content(given: str | list[Any]) -> str | list[dict[str, Any]]:
    if isinstance(given, str):
        return given
    return [{"type": "image_url", "image_url": {"url": p.image_url}} if isinstance(p, InputImage)
            else {"type": "text", "text": p.text} for p in given]


def _response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    form = body.text.format if body.text is not None else None
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return {"type": "json_object"}
    if form.json_schema is None:
        raise BadRequestError("text.format json_schema needs a schema", param="text.format.schema")
    return {"type": "json_schema", "json_schema": {"name": form.name, "schema": form.json_schema}}


class _Reply:
    """One response's identity and echoed settings; its items, usage and events."""

    def __init__(self, served: Served, body: ResponsesRequest):
        self.ident, self.created, self.model, self.body = f"resp_{uuid.uuid4().hex}", int(time.time()), served.id, body
        self.sequence = 0
        self.keep: Callable[[dict[str, Any]], None] | None = None  # stores the finished response (store: true)

    def output(self, choice: Any) -> tuple[list[ReasoningOut | OutputMessage | FunctionCallOut], bool]:
        """A whole chat reply's `choice` as output items (thinking, text, calls), and whether max tokens cut it."""
        incomplete = choice.finish_reason == "length"
        items: list[ReasoningOut | OutputMessage | FunctionCallOut] = []
        if choice.message.reasoning_content:
            items.append(self.reasoning(choice.message.reasoning_content, "completed"))
        if choice.message.content:
            items.append(self.message(choice.message.content, "incomplete" if incomplete else "completed"))
        items += [self.call(c, "completed") for c in choice.message.tool_calls or []]
        return items, incomplete

    def message(self, text: str, status: str) -> OutputMessage:
        return OutputMessage(id=f"msg_{uuid.uuid4().hex}", status=status,  # type: ignore[arg-type]
                             content=[OutputTextPart(text=text)])

    def reasoning(self, text: str, status: str) -> ReasoningOut:
        return ReasoningOut(id=f"rs_{uuid.uuid4().hex}", status=status,  # type: ignore[arg-type]
                            content=[ReasoningTextPart(text=text)] if text else [])

    def call(self, call: ToolCall, status: str) -> FunctionCallOut:
        return FunctionCallOut(id=f"fc_{uuid.uuid4().hex}", call_id=call.id, name=call.function.name,
                               arguments=call.function.arguments, status=status)  # type: ignore[arg-type]

    def response(self, items: list[ReasoningOut | OutputMessage | FunctionCallOut] | None, incomplete: bool = False,
                 done: CompletionTimings | None = None) -> ResponseObject:
        """The response object; `items` None: still running (no usage yet). `done`: the finished reply's timings,
        whose counts are the usage (output tokens: every token sampled, as llama-server counts them)."""
        body = self.body
        usage = None if items is None or done is None else ResponseUsage(
            input_tokens=done.prompt_tokens, input_tokens_details=InputTokensDetails(cached_tokens=done.cached_tokens),
            output_tokens=done.predicted_tokens, total_tokens=done.prompt_tokens + done.predicted_tokens)
        status = "in_progress" if items is None else "incomplete" if incomplete else "completed"
        choice = body.tool_choice
        return ResponseObject(
            id=self.ident, created_at=self.created, status=status, model=self.model, output=items or [], usage=usage,
            incomplete_details=IncompleteDetails(reason="max_output_tokens") if incomplete else None,
            instructions=body.instructions, max_output_tokens=body.max_output_tokens, temperature=body.temperature,
            top_p=body.top_p, tools=[t.model_dump(exclude_none=True) for t in body.tools or []],
            tool_choice=choice.model_dump() if choice is not None and not isinstance(choice, str) else choice or "auto",
            parallel_tool_calls=body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
            previous_response_id=body.previous_response_id, store=body.store, metadata=body.metadata or {},
            text={"format": body.text.format.model_dump(by_alias=True, exclude_none=True)}
            if body.text is not None and body.text.format is not None else {"format": {"type": "text"}})

    def finish(self, response: ResponseObject) -> ResponseObject:
        """The finished `response`, kept if asked."""
        if self.keep is not None:
            self.keep(response.model_dump(mode="json"))
        return response

    def stream_items(self) -> _Items:
        """The output items of this response's stream, built as deltas arrive (the MCP loop's stream feeds its
        last round through them too)."""
        return _Items(self)

    def event(self, kind: str, **fields: Any) -> tuple[str, str]:
        """One stream event, numbered."""
        payload = {"type": kind, "sequence_number": self.sequence, **{
            k: v.model_dump(mode="json") if hasattr(v, "model_dump") else v for k, v in fields.items()}}
        self.sequence += 1
        return kind, json.dumps(payload, ensure_ascii=False)

    def error(self, exc: LlamaError) -> str:
        """The stream's error event (RESPONSES'), numbered after the others."""
        fields = RESPONSES.error_event(exc)
        del fields["type"]
        return named_event(*self.event("error", **fields))


class _Items:
    """The output items of a streamed response as the chat deltas arrive: a reasoning item, a message item,
    function_call items whose arguments go out piece by piece (llama-server's event order)."""

    def __init__(self, reply: _Reply):
        self.reply, self.items = reply, []  # type: list[ReasoningOut | OutputMessage | FunctionCallOut]
        self.open: Any = None  # "reasoning", "text", or a call's index
        self.text: list[str] = []

    def _add(self, item: Any, kind: Any) -> list[tuple[str, str]]:
        self.items.append(item)
        self.open, self.text = kind, []
        return [self.reply.event("response.output_item.added", output_index=len(self.items) - 1, item=item)]

    def close(self, status: str = "completed") -> list[tuple[str, str]]:
        reply, index, kind = self.reply, len(self.items) - 1, self.open
        if kind is None:
            return []
        self.open = None
        item, text = self.items[-1], "".join(self.text)
        out = []
        if kind == "reasoning":
            item = reply.reasoning(text, "completed").model_copy(update={"id": item.id})
            out.append(reply.event("response.reasoning_text.done", item_id=item.id, output_index=index,
                                   content_index=0, text=text))
        elif kind == "text":
            part = OutputTextPart(text=text)
            item = OutputMessage(id=item.id, status=status, content=[part])  # type: ignore[arg-type]
            out.append(reply.event("response.output_text.done", item_id=item.id, output_index=index,
                                   content_index=0, text=text, logprobs=[]))
            out.append(reply.event("response.content_part.done", item_id=item.id, output_index=index,
                                   content_index=0, part=part))
        else:
            item = item.model_copy(update={"arguments": text, "status": "completed"})
            out.append(reply.event("response.function_call_arguments.done", item_id=item.id, output_index=index,
                                   name=item.name, arguments=text))
        self.items[-1] = item
        out.append(reply.event("response.output_item.done", output_index=index, item=item))
        return out

    def feed(self, delta: Any) -> list[tuple[str, str]]:
        reply, out = self.reply, []
        if delta.reasoning_content:
            if self.open != "reasoning":
                out += self.close() + self._add(reply.reasoning("", "in_progress"), "reasoning")
            self.text.append(delta.reasoning_content)
            out.append(reply.event("response.reasoning_text.delta", item_id=self.items[-1].id,
                                   output_index=len(self.items) - 1, content_index=0, delta=delta.reasoning_content))
        if delta.content:
            if self.open != "text":
                out += self.close() + self._add(reply.message("", "in_progress"), "text")
                out.append(reply.event("response.content_part.added", item_id=self.items[-1].id,
                                       output_index=len(self.items) - 1, content_index=0,
                                       part=OutputTextPart(text="")))
            self.text.append(delta.content)
            out.append(reply.event("response.output_text.delta", item_id=self.items[-1].id,
                                   output_index=len(self.items) - 1, content_index=0, delta=delta.content,
                                   logprobs=[]))
        for call in delta.tool_calls or []:
            if call.id is not None:
                name = call.function.name if call.function is not None else ""
                item = FunctionCallOut(id=f"fc_{uuid.uuid4().hex}", call_id=call.id, name=name or "", arguments="",
                                       status="in_progress")
                out += self.close() + self._add(item, ("call", call.index))
            pieces = call.function.arguments if call.function is not None else None
            if pieces and self.open == ("call", call.index):
                self.text.append(pieces)
                out.append(reply.event("response.function_call_arguments.delta", item_id=self.items[-1].id,
                                       output_index=len(self.items) - 1, delta=pieces))
        return out


async def _events(reply: _Reply, run: ChatRun) -> AsyncIterator[tuple[str, str]]:
    yield reply.event("response.created", response=reply.response(None))
    yield reply.event("response.in_progress", response=reply.response(None))
    stream = ChatStream(reply.model, run.plan)
    items = _Items(reply)
    body, read, job = reply.body, False, run.job
    async for piece in run.achunks():
        if body.return_progress and not read:  # llama-server's: the prompt read, said by an in_progress event
            extra = {"timings": timings(so_far(job, piece))} if body.timings_per_token else {}
            yield reply.event("response.in_progress", response=reply.response(None), **extra,
                              prompt_progress=progress(job))
        read = True
        for out in stream.feed(piece):
            choice = out.choices[0]
            events = items.feed(choice.delta)
            if events and body.timings_per_token and not choice.finish_reason:
                # llama-server's: the last event of each piece carries the timings so far
                kind, payload = events[-1]
                events[-1] = kind, json.dumps({**json.loads(payload), "timings": timings(so_far(job, piece))},
                                              ensure_ascii=False)
            for event in events:
                yield event
            if choice.finish_reason:
                incomplete = choice.finish_reason == "length"
                for event in items.close("incomplete" if incomplete else "completed"):
                    yield event
                assert piece.timings is not None  # the final chunk carries them
                final = reply.finish(reply.response(items.items, incomplete, piece.timings))
                # llama-server's telemetry: the last event carries its `timings`
                yield reply.event("response.incomplete" if incomplete else "response.completed", response=final,
                                  timings=timings(piece.timings))
