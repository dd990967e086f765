"""AsyncLlama: `await` and `async for` over a Llama's engine, never blocking the event loop.

The engine's worker thread hands each event to the loop with call_soon_threadsafe.
Cancelling the awaiting task, or leaving an `async for` early, cancels the request:
its slot is free at the engine's next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np

from ..blocks.sampling import LlamaSampler
from ..params import LlamaParams
from .chat import ChatCompletion, ChatCompletionChunk, ChatStream, as_chat
from .completion import Completion, CompletionChunk
from .engine import Job
from .llama import Llama, Samplers, _collect


class AsyncLlama:
    """The asyncio face of a `Llama` (which stays usable from threads at the same time)."""

    def __init__(self, llama: Llama):
        self.llama = llama

    @classmethod
    async def load(cls, params: LlamaParams | str) -> AsyncLlama:
        return cls(await asyncio.to_thread(Llama.load, params))

    async def create_completion(self, prompt: str | list[int], max_tokens: int | None = 16,
                                sampler: LlamaSampler | None = None, stop: str | list[str] | None = None,
                                stream: bool = False, logprobs: int | None = None, special: bool = False,
                                response_format: dict[str, Any] | None = None
                                ) -> Completion | AsyncIterator[CompletionChunk]:
        """As Llama.create_completion; with stream=True, an async iterator of chunks."""
        job = self.llama._job(prompt, max_tokens, sampler, stop, logprobs, special, response_format)
        if stream:
            return self._one(job)
        return _collect([c async for c in self._one(job)].__iter__(), job.prompt)

    async def create_completions(self, prompts: Sequence[str | list[int]], max_tokens: int | None = 16,
                                 sampler: Samplers = None, stop: str | list[str] | None = None,
                                 logprobs: int | None = None, special: bool = False,
                                 response_format: dict[str, Any] | None = None) -> list[Completion]:
        chains = self.llama._samplers_for(len(prompts), sampler)
        jobs = [self.llama._job(p, max_tokens, s, stop, logprobs, special, response_format, own)
                for p, (s, own) in zip(prompts, chains)]
        streams: list[list[CompletionChunk]] = [[] for _ in jobs]
        async for i, chunk in self._stream(jobs):
            streams[i].append(chunk)
        return [_collect(iter(chunks), job.prompt) for chunks, job in zip(streams, jobs)]

    async def create_chat_completion(self, messages: list[dict[str, Any]], max_tokens: int | None = None,
                                     sampler: LlamaSampler | None = None, stop: str | list[str] | None = None,
                                     stream: bool = False, tools: list[dict[str, Any]] | None = None,
                                     tool_choice: str | dict[str, Any] | None = None,
                                     response_format: dict[str, Any] | None = None, chat_template: str | None = None
                                     ) -> ChatCompletion | AsyncIterator[ChatCompletionChunk]:
        """As Llama.create_chat_completion; with stream=True, an async iterator of OpenAI chunks."""
        llama = self.llama
        tokens, chain, kind = llama._chat_prompt(messages, sampler, tools, tool_choice, response_format,
                                                 chat_template)
        job = llama._job(tokens, max_tokens, chain, stop, None, False, response_format)
        name = llama.params.model_path.name
        if stream:
            return self._chat_chunks(job, ChatStream(name, kind))
        done = _collect([c async for c in self._one(job)].__iter__(), job.prompt)
        return as_chat(done, name, kind)

    async def _chat_chunks(self, job: Job, stream: ChatStream) -> AsyncIterator[ChatCompletionChunk]:
        yield stream.first()
        async for piece in self._one(job):
            for out in stream.feed(piece):
                yield out

    async def embed(self, texts: list[str], normalize: bool = True, pooling: str | None = None,
                    truncate: bool = False) -> np.ndarray | list[np.ndarray]:
        return await asyncio.to_thread(self.llama.embed, texts, normalize, pooling, truncate)

    async def rerank(self, query: str, documents: list[str], truncate: bool = False) -> np.ndarray:
        return await asyncio.to_thread(self.llama.rerank, query, documents, truncate)

    def cancel(self) -> None:
        self.llama.cancel()

    async def close(self) -> None:
        await asyncio.to_thread(self.llama.close)

    async def __aenter__(self) -> AsyncLlama:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _one(self, job: Job) -> AsyncIterator[CompletionChunk]:
        async for _, chunk in self._stream([job]):
            yield chunk

    async def _stream(self, jobs: list[Job]) -> AsyncIterator[tuple[int, CompletionChunk]]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, CompletionChunk | BaseException]] = asyncio.Queue()
        for i, job in enumerate(jobs):
            job.sink = _LoopSink(loop, events, i)
        for job in jobs:
            self.llama.engine.submit(job)
        left = len(jobs)
        try:
            while left:
                i, event = await events.get()
                if isinstance(event, BaseException):
                    raise event
                if event.stop_reason is not None:
                    left -= 1
                yield i, event
        finally:
            if left:
                for job in jobs:
                    job.cancel()
                self.llama.engine.wake()


class _LoopSink:
    """Events from the engine's thread into an asyncio queue (raises once the loop is closed: the job stops)."""

    __slots__ = ("loop", "events", "index")

    def __init__(self, loop: asyncio.AbstractEventLoop, events: asyncio.Queue[Any], index: int):
        self.loop, self.events, self.index = loop, events, index

    def __call__(self, event: CompletionChunk | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, event))
