"""AsyncLlama: `await` and `async for` over a Llama's engine, never blocking the event loop.

Requests are built as Llama builds them (jobs.py, a chat's through chat_call.py) and run through the asyncio
loop of the event pump (events.astream; events.agather when the result is awaited whole).
Cancelling the awaiting task, or leaving an `async for` early, cancels the request: its
slot is free at the engine's next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
from typing_extensions import Unpack

from ..blocks.sampling import LlamaSampler
from ..params import LlamaParams, SamplerParams
from .chat import ChatCompletion, ChatCompletionChunk, ChatSpec
from .chat_call import ChatCall, start_chat
from .completion import Completion, CompletionChunk
from .events import achunks, agather, agather_chunks
from .jobs import Samplers, collect, collect_many, completion_job, completion_jobs
from .llama import Llama
from .sampling_options import SamplingOptions, call_sampler, calls_samplers
from .structured import ResponseFormat, with_parsed
from .tool_schema import ToolSpec


class AsyncLlama:
    """The asyncio face of a `Llama` (which stays usable from threads at the same time)."""

    def __init__(self, llama: Llama):
        self.llama = llama

    @classmethod
    async def load(cls, params: LlamaParams | str, **options: Any) -> AsyncLlama:
        """As Llama.load (`options`: LlamaParams fields), in a worker thread."""
        return cls(await asyncio.to_thread(Llama.load, params, **options))

    async def create_completion(self, prompt: str | list[int], max_tokens: int | None = 16,
                                sampler: LlamaSampler | SamplerParams | str | None = None,
                                stop: str | list[str] | None = None,
                                stream: bool = False, logprobs: int | None = None, special: bool = False,
                                response_format: ResponseFormat | None = None, **sampling: Unpack[SamplingOptions]
                                ) -> Completion | AsyncIterator[CompletionChunk]:
        """As Llama.create_completion; with stream=True, an async iterator of chunks."""
        chain, own = call_sampler(self.llama, sampler, sampling, "create_completion")
        job = completion_job(self.llama, prompt, max_tokens, chain, stop, logprobs, special, response_format, own)
        if stream:
            return achunks(self.llama.engine, job)
        return with_parsed(collect(await agather_chunks(self.llama.engine, job), job.prompt), response_format)

    async def create_completions(self, prompts: Sequence[str | list[int]], max_tokens: int | None = 16,
                                 sampler: Samplers = None, stop: str | list[str] | None = None,
                                 logprobs: int | None = None, special: bool = False,
                                 response_format: ResponseFormat | None = None,
                                 **sampling: Unpack[SamplingOptions]) -> list[Completion]:
        sampler = calls_samplers(self.llama, sampler, sampling, "create_completions")
        jobs = completion_jobs(self.llama, prompts, max_tokens, sampler, stop, logprobs, special, response_format)
        return [with_parsed(done, response_format) for done in collect_many(await agather(self.llama.engine, jobs),
                                                                            jobs)]

    async def create_chat_completion(self, messages: list[dict[str, Any]], max_tokens: int | None = None,
                                     sampler: LlamaSampler | SamplerParams | str | None = None,
                                stop: str | list[str] | None = None,
                                     stream: bool = False, tools: list[ToolSpec] | None = None,
                                     tool_choice: str | dict[str, Any] | None = None,
                                     response_format: ResponseFormat | None = None, chat_template: str | None = None,
                                     reasoning_format: str | None = None, reasoning_effort: str | None = None,
                                     chat_template_kwargs: dict[str, Any] | None = None,
                                     parallel_tool_calls: bool | None = None,
                                     reasoning_budget_tokens: int | None = None,
                                     reasoning_budget_message: str | None = None,
                                     **sampling: Unpack[SamplingOptions]
                                     ) -> ChatCompletion | AsyncIterator[ChatCompletionChunk]:
        """As Llama.create_chat_completion; with stream=True, an async iterator of OpenAI chunks."""
        chain, own = call_sampler(self.llama, sampler, sampling, "create_chat_completion")
        spec = ChatSpec(messages, tools=tools, tool_choice=tool_choice, response_format=response_format,
                        chat_template=chat_template, reasoning_format=reasoning_format,
                        reasoning_effort=reasoning_effort, chat_template_kwargs=chat_template_kwargs,
                        parallel_tool_calls=parallel_tool_calls, reasoning_budget_tokens=reasoning_budget_tokens,
                        reasoning_budget_message=reasoning_budget_message)
        run = start_chat(self.llama, ChatCall(spec, chain, own, max_tokens, stop))
        return run.astream() if stream else await run.aresult()

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
