"""OpenAI's chat wire format and the chat path's: a ChatRequest as its ChatCall (with llama-server's checks of
fields that exclude each other), and the replies back as a chat.completion or its chunks.

With llama-server's fields too (request_fields.py): logprobs/top_logprobs, n choices (each
its own job in the engine's batches), logit_bias, grammar and json_schema,
timings_per_token, return_progress, and its `timings` on every reply.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from ...high.chat import GRAMMAR_WITH_TOOLS, ChatCompletionChunk, ChatSpec, ChatStream, Delta, Usage, grammar_with_tools
from ...high.chat_call import ChatCall, ChatRun
from ...high.completion import Completion, CompletionChunk
from ...high.jobs import collect
from ...high.structured import engine_for
from ..errors import BadRequestError
from ..registry import Served
from ..request_fields import grammar_text, logit_bias, progress_fields, token_entry
from ..shared import so_far, timings, verbose_result
from .schemas import ChatReply, ChatRequest


def chat_call(body: ChatRequest, served: Served, limit: int | None) -> ChatCall:
    """The ChatCall that asks for what `body` asks for, at most `limit` tokens a reply."""
    llama = served.llama
    n_logprobs = _n_logprobs(body)
    sampling = body.sampling(llama.params.seed, served.sampling)
    response_format = body.response_format
    formatted = isinstance(response_format, dict) and response_format.get("type") not in (None, "text")
    if formatted and body.grammar:
        raise BadRequestError("Cannot use both json_schema and grammar", param="grammar")
    # As llama-server: response_format wins over the json_schema field. Under llguidance grammar and json_schema go
    # with the call (high/structured.py), not to the sampler as GBNF.
    gbnf = engine_for(llama.params.structured_engine, body.structured_engine) == "gbnf"
    grammar = grammar_text(body.grammar, None if formatted else body.json_schema) if gbnf else None
    bias = logit_bias(llama.model, body.logit_bias, body.ignore_eos)
    if bias or grammar:
        sampling = sampling.model_copy(update={"logit_bias": bias, "grammar": grammar})
    # grammar and json_schema go to the sampler above (as llama-server's fields); the rest to the chat layer
    fields = {k: v for k, v in body.chat_fields().items() if not gbnf or k not in ("grammar", "json_schema")}
    options = served.chat_options(**fields)

    # n replies to one prompt: each its own sampler (from `sampling`), all in the engine's batches
    return ChatCall(ChatSpec(body.messages, tools=body.tools, tool_choice=body.tool_choice,
                             response_format=response_format, structured_engine=body.structured_engine, **options),
                    sampling, max_tokens=limit, stop=body.stop, logprobs=n_logprobs, n=body.n, model=served.id)


def _n_logprobs(body: ChatRequest) -> int | None:
    """The top tokens to give with each sampled one (None: no logprobs), with llama-server's rules."""
    if not body.logprobs:
        if body.top_logprobs is not None:
            raise BadRequestError("top_logprobs requires logprobs to be set to true", param="top_logprobs")
        return None
    if body.tools and body.stream:
        raise BadRequestError("logprobs is not supported with tools + stream", param="logprobs")
    return 20 if body.top_logprobs is None else body.top_logprobs


def check_fields(body: ChatRequest) -> None:
    """llama-server's 400s for fields that exclude each other."""
    if body.continue_final_message and body.add_generation_prompt:
        raise BadRequestError("Cannot set both add_generation_prompt and continue_final_message to true.",
                              param="continue_final_message")
    if grammar_with_tools(body.grammar, body.tools, body.tool_choice):  # (the grammar goes around the chat layer)
        raise BadRequestError(GRAMMAR_WITH_TOOLS, param="grammar")


def chat_reply(served: Served, run: ChatRun, done: list[Completion]) -> ChatReply:
    """The chat.completion of `run`'s finished replies `done`: a choice each, the usage of all."""
    llama, n_logprobs = served.llama, run.call.logprobs
    replies = [run.reply(c) for c in done]
    choices = []
    for i, (reply, completion) in enumerate(zip(replies, done)):
        choice = reply.choices[0].model_copy(update={"index": i})
        if n_logprobs is not None:
            choice.logprobs = {"content": [token_entry(llama.model, lp) for lp in completion.logprobs or []]}
        choices.append(choice)
    usage = replies[0].usage
    n_out = sum(c.timings.predicted_tokens for c in done)  # every choice's, each with its end token (llama-server)
    usage = usage.model_copy(update={"completion_tokens": n_out, "total_tokens": usage.prompt_tokens + n_out})
    return ChatReply(**{**replies[0].model_dump(), "choices": choices, "usage": usage},
                     timings=timings(done[0].timings))


async def chat_events(served: Served, run: ChatRun, body: ChatRequest,
                      settings: dict[str, Any] | None = None) -> AsyncIterator[str]:
    """`run`'s replies as chat.completion.chunk events, each choice's by its index."""
    model = served.llama.model
    jobs, plan = run.jobs, run.plan
    streams = [ChatStream(served.id, plan) for _ in jobs]
    kept: list[list[CompletionChunk]] = [[] for _ in jobs]  # each job's pieces, for its __verbose (settings given)
    pending: list[list[dict[str, Any]]] = [[] for _ in jobs]  # logprobs of tokens whose text is held back
    for i, stream in enumerate(streams):  # llama-server's first delta: the role and a null content (OpenAI's: "")
        yield _chunk(stream.first(), i, content=None)
    for job in jobs:
        job.progress = body.return_progress
    ended: dict[str, Any] | None = None  # the timings of the last reply that ended
    async for i, piece in run.aevents():
        job = jobs[i]
        if piece.progress is not None:  # llama-server's: when the prompt starts, then after each batch of it
            fields: dict[str, Any] = {"prompt_progress": progress_fields(piece.progress)}
            if body.timings_per_token and piece.timings is not None:
                fields["timings"] = timings(piece.timings)
            yield _chunk(streams[i].chunk(Delta()), i, fields)
            continue
        if settings is not None:
            kept[i].append(piece)
        if piece.logprobs:
            pending[i] += [token_entry(model, lp) for lp in piece.logprobs]
        outs = streams[i].feed(piece)
        for k, out in enumerate(outs):
            last = k == len(outs) - 1
            if pending[i] and (out.choices[0].delta.content or out.choices[0].finish_reason):
                out.choices[0].logprobs = {"content": pending[i]}
                pending[i] = []
            fields = {}
            if last and (body.timings_per_token or piece.stop_reason is not None):
                now = timings(so_far(job, piece))
                if piece.stop_reason is not None:
                    ended = now
                # as llama-server: a reply's final timings go on the stream's last chunk, the usage's if asked
                if piece.stop_reason is None or not body.include_usage:
                    fields = {**fields, "timings": now}
            if settings is not None and out.choices[0].finish_reason:  # llama-server: on the final chunk
                done = collect(kept[i], job.prompt)
                fields = {**fields, "__verbose": verbose_result(served, i, done, plan.params["prompt"], settings)}
            yield _chunk(out, i, fields)
    if body.include_usage:  # OpenAI's stream_options: one more chunk, no choices, the usage
        n_prompt, n_out = jobs[0].n_prompt, sum(job.produced for job in jobs)
        usage = Usage(prompt_tokens=n_prompt, completion_tokens=n_out, total_tokens=n_prompt + n_out)
        first = streams[0]
        text = ChatCompletionChunk(id=first.ident, created=first.created, model=first.model, choices=[],
                                   usage=usage).model_dump_json(exclude_none=True)
        yield text if ended is None else json.dumps({**json.loads(text), "timings": ended})


def _chunk(out: ChatCompletionChunk, index: int, extra: dict[str, Any] | None = None, **delta: Any) -> str:
    """`out` as JSON (None fields left out, but finish_reason: null until the last, as llama-server and OpenAI send
    it), with `extra`'s fields and `delta`'s in its delta (a None kept)."""
    out.choices[0].index = index
    chunk = out.model_dump(mode="json", exclude_none=True)  # a dict: a chunk a token is not dumped, read and dumped
    chunk["choices"][0].setdefault("finish_reason", None)
    chunk["choices"][0]["delta"].update(delta)
    return json.dumps({**chunk, **(extra or {})})
