"""A reply streamed as OpenAI's ChatCompletionChunks, as llama-server streams it: the same ChatStream for
threads (as_chunks) and asyncio (as_achunks)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ..blocks.chat_layer import ChatReplyParser
from .chat_output import (
    ChatCompletionChunk,
    ChunkChoice,
    Delta,
    DeltaFunction,
    DeltaToolCall,
    FinishReason,
    finish_reason,
)
from .chat_plan import ChatPlan
from .completion import CompletionChunk


def as_chunks(chunks: Iterator[CompletionChunk], model: str, plan: ChatPlan | None = None
              ) -> Iterator[ChatCompletionChunk]:
    """OpenAI's stream of a completion's chunks (see ChatStream)."""
    stream = ChatStream(model, plan)
    yield stream.first()
    for piece in chunks:
        yield from stream.feed(piece)


async def as_achunks(chunks: AsyncIterator[CompletionChunk], model: str, plan: ChatPlan | None = None
                     ) -> AsyncIterator[ChatCompletionChunk]:
    """as_chunks on an event loop."""
    stream = ChatStream(model, plan)
    yield stream.first()
    async for piece in chunks:
        for out in stream.feed(piece):
            yield out


class ChatStream:
    """Completion chunks in, OpenAI chat chunks out: the same for threads and asyncio.

    Each piece of text goes through llama.cpp's parser of the template's format, as llama-server
    streams it: reasoning in delta.reasoning_content, the answer in delta.content, and each tool
    call as its name (with id and index) and then its arguments piece by piece.
    """

    def __init__(self, model: str, plan: ChatPlan | None = None):
        self.ident, self.created, self.model = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), model
        self.plan = plan
        self._parser = ChatReplyParser(plan.parser(True)) if plan is not None else None
        self.calls = 0  # tool calls begun so far

    def chunk(self, delta: Delta, finish: FinishReason | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.ident, created=self.created, model=self.model,
                                   choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish)])

    def first(self) -> ChatCompletionChunk:
        return self.chunk(Delta(role="assistant", content=""))

    def feed(self, piece: CompletionChunk) -> list[ChatCompletionChunk]:
        final = piece.stop_reason is not None
        if self._parser is None:
            out = [self.chunk(Delta(content=piece.text))] if piece.text else []
        else:
            if not piece.text and not final:
                return []
            diffs = self._parser.update(piece.text, partial=not final)
            out = [self.chunk(delta) for delta in map(self._delta, diffs) if delta is not None]
        if final:
            finish = finish_reason(piece.stop_reason, bool(self.calls))
            out.append(self.chunk(Delta(), finish))
        return out

    def _delta(self, diff: dict[str, Any]) -> Delta | None:
        delta = Delta(reasoning_content=diff["reasoning_content"] or None, content=diff["content"] or None)
        if diff["index"] >= 0:
            call = DeltaToolCall(index=diff["index"])
            if diff["id"]:
                call.id, call.type = diff["id"], "function"
                self.calls = max(self.calls, diff["index"] + 1)
            if diff["name"] or diff["arguments"]:
                call.function = DeltaFunction(name=diff["name"] or None, arguments=diff["arguments"] or None)
            delta.tool_calls = [call]
        if delta.content is None and delta.reasoning_content is None and delta.tool_calls is None:
            return None
        return delta
