"""OpenAI's Responses wire format and the chat path's: a request as the chat request an OpenAI client would send
for it (instructions as the first system message, function_call items as an assistant's tool_calls,
function_call_output items as tool messages, text.format as response_format) and its ChatCall; the reply as a
response object (reasoning, message and function_call items, usage) or as its numbered events.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from ...errors import LlamaError
from ...high.chat import ChatSpec, ChatStream
from ...high.chat_call import ChatCall, ChatRun
from ...high.chat_output import ToolCall
from ...high.completion import CompletionTimings
from ..dialects import RESPONSES, named_event
from ..errors import BadRequestError
from ..mcp.responses import mcp_tool
from ..openai.schemas import ChatRequest
from ..registry import Served
from ..request_fields import progress_fields
from ..shared import so_far, timings
from .schemas import (
    FunctionCallItem,
    FunctionCallOut,
    FunctionCallOutputItem,
    IncompleteDetails,
    InputImage,
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


def chat_call(body: ResponsesRequest, chat: ChatRequest, served: Served, limit: int | None) -> ChatCall:
    """The ChatCall of `body`, whose chat request is `chat` (as_chat_request), at most `limit` tokens."""
    effort = body.reasoning.effort if body.reasoning is not None else None
    options = served.chat_options(reasoning_effort=effort, parallel_tool_calls=body.parallel_tool_calls)
    return ChatCall(ChatSpec(chat.messages, tools=chat.tools, tool_choice=chat.tool_choice,
                             response_format=chat.response_format, structured_engine=body.structured_engine,
                             **options),
                    chat.sampling(served.llama.params.seed, served.sampling), max_tokens=limit, model=served.id)


class Reply:
    """One response's identity and echoed settings; its items, usage and events."""

    def __init__(self, served: Served, body: ResponsesRequest):
        self.ident, self.created, self.model, self.body = f"resp_{uuid.uuid4().hex}", int(time.time()), served.id, body
        self.sequence = 0
        self.keep: Callable[[dict[str, Any]], None] | None = None  # stores the finished response (store: true)

    def output(self, choice: Any) -> tuple[list[ReasoningOut | OutputMessage | FunctionCallOut], bool]:
        """A whole chat reply's `choice` as output items (thinking, text, calls), and whether max tokens cut it:
        then its last item, the one cut, is "incomplete" (OpenAI's, whatever its kind: a call's arguments too)."""
        incomplete = choice.finish_reason == "length"
        items: list[ReasoningOut | OutputMessage | FunctionCallOut] = []
        if choice.message.reasoning_content:
            items.append(self.reasoning(choice.message.reasoning_content, "completed"))
        if choice.message.content:
            items.append(self.message(choice.message.content, "completed"))
        items += [self.call(c, "completed") for c in choice.message.tool_calls or []]
        if incomplete and items:
            items[-1] = items[-1].model_copy(update={"status": "incomplete"})
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

    def stream_items(self) -> StreamItems:
        """The output items of this response's stream, built as deltas arrive (the MCP loop's stream feeds its
        last round through them too)."""
        return StreamItems(self)

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


class StreamItems:
    """The output items of a streamed response as the chat deltas arrive: a reasoning item, a message item,
    function_call items whose arguments go out piece by piece (llama-server's event order)."""

    def __init__(self, reply: Reply):
        self.reply, self.items = reply, []  # type: list[ReasoningOut | OutputMessage | FunctionCallOut]
        self.open: Any = None  # "reasoning", "text", or a call's index
        self.text: list[str] = []

    def _add(self, item: Any, kind: Any) -> list[tuple[str, str]]:
        self.items.append(item)
        self.open, self.text = kind, []
        return [self.reply.event("response.output_item.added", output_index=len(self.items) - 1, item=item)]

    def close(self, status: str = "completed") -> list[tuple[str, str]]:
        """The open item's done events; `status` "incomplete": max tokens cut it (the reply's last item)."""
        reply, index, kind = self.reply, len(self.items) - 1, self.open
        if kind is None:
            return []
        self.open = None
        item, text = self.items[-1], "".join(self.text)
        out = []
        if kind == "reasoning":
            item = reply.reasoning(text, status).model_copy(update={"id": item.id})
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
            item = item.model_copy(update={"arguments": text, "status": status})
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


async def events(reply: Reply, run: ChatRun) -> AsyncIterator[tuple[str, str]]:
    yield reply.event("response.created", response=reply.response(None))
    yield reply.event("response.in_progress", response=reply.response(None))
    stream = ChatStream(reply.model, run.plan)
    items = StreamItems(reply)
    body, job = reply.body, run.job
    job.progress = body.return_progress
    async for piece in run.achunks():
        if piece.progress is not None:  # llama-server's: an in_progress event when the prompt starts and per batch
            extra = {"timings": timings(piece.timings)} if body.timings_per_token and piece.timings else {}
            yield reply.event("response.in_progress", response=reply.response(None), **extra,
                              prompt_progress=progress_fields(piece.progress))
            continue
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
