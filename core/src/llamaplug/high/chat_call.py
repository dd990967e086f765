"""One chat call, whatever face it came through: the `ChatCall` every face builds, and the `ChatRun` it starts.

    call = ChatCall(ChatSpec(messages, tools=[...]), sampler=SamplerParams(temperature=0), max_tokens=64)
    run = start_chat(llama, call)      # checked, rendered, tokenized: a bad argument is raised here
    run.result()                       # a ChatCompletion (await run.aresult() on an event loop)
    run.stream()                       # its ChatCompletionChunks (async for ... in run.astream())

Llama, AsyncLlama, the llama-cpp-python compat, each HTTP API family and the server's warm-up
all go through here: the one place that builds a chat's jobs (jobs.prepare_chat) and hands
them to the engine (events.py). A face that shapes its own replies (the server's dialects) reads
the raw pieces (`chunks`, `events`, `completions`) and the `plan` they are read with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING

from ..blocks.sampling import LlamaSampler
from ..errors import InvalidParameterError
from . import events
from .chat_output import ChatCompletion, ChatCompletionChunk, Usage
from .chat_plan import ChatPlan, ChatSpec, plan_chat
from .chat_reply import as_chat
from .chat_stream import as_achunks, as_chunks
from .completion import Completion, CompletionChunk
from .engine import Job
from .jobs import Samplers, collect, collect_many, prepare_chat, samplers_for

if TYPE_CHECKING:
    from .llama import Llama


@dataclasses.dataclass
class ChatCall:
    """What to render (`spec`: messages, tools, tool_choice, response format, template, reasoning options), how
    to sample and how far, and how many replies.

    `sampler`: None (greedy), a LlamaSampler (one reply; the run closes it with `own_sampler=True`), or for
    each of `n` replies its own: a SamplerParams, a factory, a list (requests.samplers_for). `logprobs`: the
    most likely tokens to give with each sampled one (None: none). `allow_empty`: no messages at all is the
    template's own prompt (its generation prompt), as llama-server answers an empty list, not an error.
    `model`: the name replies carry (default: the model file's)."""

    spec: ChatSpec
    sampler: Samplers = None
    own_sampler: bool = False
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    logprobs: int | None = None
    n: int = 1
    allow_empty: bool = False
    model: str | None = None


class ChatRun:
    """A ChatCall on one Llama: its jobs (one per reply, built by `prepare`) and the plan the replies are read
    with. The engine gets the jobs when a result or a stream is asked for; leaving a stream early cancels them.
    """

    def __init__(self, llama: Llama, call: ChatCall):
        if isinstance(call.n, bool) or not isinstance(call.n, int) or call.n < 1:
            raise InvalidParameterError(f"n must be an int >= 1, got {call.n!r}", field="n")
        self.llama, self.call = llama, call
        self.name = call.model if call.model is not None else llama.params.model_path.name
        self.jobs: list[Job] = []
        self._plan: ChatPlan | None = None

    @property
    def plan(self) -> ChatPlan:
        assert self._plan is not None, "prepare() first"
        return self._plan

    @property
    def job(self) -> Job:
        """The job of a one-reply call."""
        assert len(self.jobs) == 1, "prepare() a call of n=1 first"
        return self.jobs[0]

    def prepare(self) -> ChatRun:
        """Check, render and tokenize the call: one job per reply, each with its own sampler (once only)."""
        if self.jobs:
            return self
        call = self.call
        if isinstance(call.sampler, LlamaSampler):
            if call.n != 1:
                samplers_for(self.llama, call.n, call.sampler)  # raises: one sampler object, several replies
            given = [(call.sampler, call.own_sampler)]
        else:
            given = samplers_for(self.llama, call.n, call.sampler)
        jobs: list[Job] = []
        try:
            for sampler, owned in given:
                job, self._plan = prepare_chat(self.llama, call.spec, call.max_tokens, sampler, call.stop, owned,
                                               call.logprobs, allow_empty=call.allow_empty)
                jobs.append(job)
        except BaseException:
            for job in jobs:
                job.sampler.close()
            for sampler, owned in given[len(jobs):]:
                if owned and sampler is not None:
                    sampler.close()
            raise
        self.jobs = jobs
        return self

    def close(self) -> None:
        """Let go of jobs that will not run (their own samplers closed)."""
        for job in self.jobs:
            if job.own_sampler:
                job.sampler.close()
        self.jobs = []

    # -- the raw pieces, for a face that shapes its own replies ---------------------------------------------
    def chunks(self) -> Iterator[CompletionChunk]:
        """The reply's completion chunks as they are generated (n=1)."""
        return events.chunks(self.llama.engine, self.prepare().job)

    def achunks(self) -> AsyncIterator[CompletionChunk]:
        return events.achunks(self.llama.engine, self.prepare().job)

    def events(self) -> Iterator[tuple[int, CompletionChunk]]:
        """(reply index, chunk) of every reply, as they are generated."""
        return events.stream(self.llama.engine, self.prepare().jobs)

    def aevents(self) -> AsyncIterator[tuple[int, CompletionChunk]]:
        return events.astream(self.llama.engine, self.prepare().jobs)

    def completions(self) -> list[Completion]:
        """Every reply's Completion (the raw text, tokens, timings), in order, once all have ended."""
        jobs = self.prepare().jobs
        return collect_many(events.gather(self.llama.engine, jobs), jobs)

    async def acompletions(self) -> list[Completion]:
        jobs = self.prepare().jobs
        return collect_many(await events.agather(self.llama.engine, jobs), jobs)

    def completion(self) -> Completion:
        """The Completion of a one-reply call."""
        job = self.prepare().job
        return collect(events.gather_chunks(self.llama.engine, job), job.prompt)

    async def acompletion(self) -> Completion:
        job = self.prepare().job
        return collect(await events.agather_chunks(self.llama.engine, job), job.prompt)

    # -- OpenAI's shapes ------------------------------------------------------------------------------------
    def reply(self, completion: Completion) -> ChatCompletion:
        """The ChatCompletion of one of this run's finished replies (its text read with the plan)."""
        return as_chat(completion, self.name, self.plan, self.call.spec.response_format)

    def result(self) -> ChatCompletion:
        """The ChatCompletion (n choices), once every reply has ended."""
        return self._merged(self.completions())

    async def aresult(self) -> ChatCompletion:
        return self._merged(await self.acompletions())

    def stream(self) -> Iterator[ChatCompletionChunk]:
        """OpenAI's chunks of the reply (n=1), as llama-server streams them (chat_stream.ChatStream)."""
        self.prepare()
        return as_chunks(self.chunks(), self.name, self.plan)

    def astream(self) -> AsyncIterator[ChatCompletionChunk]:
        self.prepare()
        return as_achunks(self.achunks(), self.name, self.plan)

    def _merged(self, done: Sequence[Completion]) -> ChatCompletion:
        replies = [self.reply(c) for c in done]
        if len(replies) == 1:
            return replies[0]
        first = replies[0]
        n_out = sum(r.usage.completion_tokens for r in replies)
        usage = Usage(prompt_tokens=first.usage.prompt_tokens, completion_tokens=n_out,
                      total_tokens=first.usage.prompt_tokens + n_out)
        choices = [r.choices[0].model_copy(update={"index": i}) for i, r in enumerate(replies)]
        return first.model_copy(update={"choices": choices, "usage": usage})

    # -- counting -------------------------------------------------------------------------------------------
    def prompt_tokens(self) -> int:
        """How many tokens the call's messages and tools are, rendered by the chat template: llama-server's count
        (no generation, no context check, no sampler; a template with no place for tools counts them out)."""
        spec, llama = self.call.spec, self.llama
        tools = spec.tools if spec.tools and spec.tool_choice != "none" else None
        counted = dataclasses.replace(spec, tools=tools, tool_choice=None, response_format=None, json_schema=None,
                                      grammar=None)
        messages = [] if self.call.allow_empty and isinstance(spec.messages, list) and not spec.messages else None
        try:
            plan = plan_chat(llama, counted, messages)
        except InvalidParameterError as exc:
            if exc.field != "tools":
                raise
            plan = plan_chat(llama, dataclasses.replace(counted, tools=None), messages)
        model = llama.model
        return len(model.tokenize(plan.params["prompt"], model.add_bos, special=True))


def start_chat(llama: Llama, call: ChatCall) -> ChatRun:
    """The run of `call` on `llama`, prepared: every check made and the prompt tokenized in the caller's thread
    (a bad argument is raised here and never reaches the engine)."""
    return ChatRun(llama, call).prepare()


def chat_results(runs: Sequence[ChatRun]) -> list[ChatCompletion]:
    """The results of several runs whose jobs share the engine's batches (all given to it at once)."""
    jobs = [job for run in runs for job in run.prepare().jobs]
    done = iter(collect_many(events.gather(runs[0].llama.engine, jobs), jobs) if jobs else [])
    return [run._merged([next(done) for _ in run.jobs]) for run in runs]
