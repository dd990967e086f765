"""What several API families' routes share: llama-server's result shapes and its completion run, and a chat's
prompt count.

llama-server's result, `timings` and `generation_settings` objects are /completion's and /infill's answers, and
OpenAI's chat and completions put them in a reply's `__verbose`, `timings` (timings_per_token) and
`generation_settings`; Responses streams read a running job's timings with `so_far`. The chat prompt count answers
all three `input_tokens` routes (OpenAI's, Anthropic's count_tokens, Responses').

A route module imports this, never another route module (a family's own shared pieces live in its package).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..errors import LlamaError
from ..high.chat import ChatSpec
from ..high.chat_call import ChatCall, ChatRun
from ..high.completion import Completion, CompletionChunk, CompletionTimings, StopReason, TokenLogprob
from ..high.engine import Job
from ..high.events import agather, astream
from ..high.jobs import collect_many, completion_jobs
from ..high.structured import engine_for
from ..params import SamplerParams
from .dialects import NATIVE
from .errors import BadRequestError, exceeds_context
from .native.schemas import NativeCompletionRequest
from .openai.schemas import ChatRequest
from .registry import Served
from .request_fields import grammar_text, logit_bias, progress_fields, token_entry
from .streaming import off_loop, unless_gone

_STOP_TYPES = {StopReason.EOS: "eos", StopReason.MAX_TOKENS: "limit", StopReason.CONTEXT_FULL: "limit",
               StopReason.STOP_SEQUENCE: "word", StopReason.CANCELLED: "none"}


async def run(request: Request, served: Served, body: NativeCompletionRequest, prompts: list[list[int]],
              texts: list[str]) -> Any:
    """Generate for each prompt (token ids) and answer in llama-server's shape: one result, a list, or a stream."""
    llama = served.llama
    asked = body.predict()  # n_predict, max_completion_tokens or max_tokens, in llama-server's order
    n_predict = asked if asked is not None else request.app.state.n_predict
    # -1 given is the server's -n, as llama-server's slot reads it (generation_settings still say -1)
    limit = n_predict if n_predict >= 0 else request.app.state.n_predict
    sampling = body.sampling(llama.params.seed, served.sampling)
    grammar, schema = getattr(body, "grammar", None), getattr(body, "json_schema", None)
    engine = getattr(body, "structured_engine", None)
    gbnf = engine_for(llama.params.structured_engine, engine) == "gbnf"
    extra = {"logit_bias": logit_bias(llama.model, body.logit_bias, body.ignore_eos),
             "grammar": grammar_text(grammar, schema) if gbnf else None}
    if any(extra.values()):
        sampling = sampling.model_copy(update=extra)
    if not gbnf and grammar and schema is not None:
        raise BadRequestError("Cannot use both json_schema and grammar", param="grammar")
    # Under llguidance the schema or grammar goes with the call (high/structured.py), not to the sampler as GBNF.
    form = None if gbnf or schema is None else {"type": "json_schema", "json_schema": {"schema": schema or
                                                                                       {"type": "object"}}}
    n_probs = body.n_probs or None  # llama-server: 0 gives none
    jobs = await off_loop(lambda: completion_jobs(llama, prompts, None if limit < 0 else limit, sampling,
                                                  body.stop, n_probs, False, form, engine,
                                                  None if gbnf else grammar or None), request)
    settings = _settings(sampling, n_predict, body)
    if body.stream:
        for job in jobs:
            job.progress = body.return_progress
        return StreamingResponse(_events(served, jobs, texts, settings, body.post_sampling_probs,
                                         body.timings_per_token),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    done = collect_many(await unless_gone(request, agather(llama.engine, jobs)), jobs)
    results = [result(served, i, c, texts[i], settings, body.stop or [], body.return_tokens, body.post_sampling_probs)
               for i, c in enumerate(done)]
    return results[0] if len(results) == 1 else results


def mixed_tokens(pieces: list[int | str], tokenize: Any) -> list[int]:
    """llama-server's mixed prompt ([12, "text", 34]) as token ids: each text read by `tokenize(text, first)`, the
    model's special tokens added only to a text that comes first (its tokenize_mixed)."""
    tokens: list[int] = []
    for i, piece in enumerate(pieces):
        tokens += tokenize(piece, i == 0) if isinstance(piece, str) else [piece]
    return tokens


def check_room(served: Served, tokens: list[int], param: str) -> None:
    """A prompt the slot cannot hold with room for one token is llama-server's exceed_context_size_error (a 400
    naming `param`), before the engine sees it."""
    room = served.llama.engine.n_ctx_seq
    if len(tokens) >= room:
        raise exceeds_context(len(tokens), room, param)


def result(served: Served, index: int, done: Completion, prompt: str, settings: dict[str, Any],
           stops: list[str], return_tokens: bool, post: bool = False) -> dict[str, Any]:
    """llama-server's final result of one prompt (completion_probabilities when the job read logprobs)."""
    reason = done.stop_reason
    word = done.stop_string or ""  # set when reason is STOP_SEQUENCE
    probs = {} if done.logprobs is None else {
        "completion_probabilities": [token_entry(served.llama.model, _after_chain(lp, settings, post), post)
                                     for lp in done.logprobs]}
    n_prompt = done.timings.prompt_tokens  # (media positions included)
    return {**probs, "index": index, "content": done.text, "tokens": done.tokens if return_tokens else [],
            "id_slot": -1, "stop": True, "model": served.id, "tokens_predicted": done.timings.predicted_tokens,
            "tokens_evaluated": n_prompt, "generation_settings": settings, "prompt": prompt,
            # truncated: the context filled, the reply cut there or its oldest tokens dropped (--context-shift)
            "has_new_line": "\n" in done.text, "stop_type": _STOP_TYPES[reason],
            "truncated": reason is StopReason.CONTEXT_FULL or done.timings.context_shifts > 0,
            # tokens_cached is llama-server's n_past: the last token sampled is not decoded
            "stopping_word": word, "tokens_cached": n_prompt + max(0, done.timings.predicted_tokens - 1),
            "timings": timings(done.timings)}


def verbose_result(served: Served, index: int, done: Completion, prompt: str, settings: dict[str, Any]
                   ) -> dict[str, Any]:
    """llama-server's `__verbose` of an OpenAI reply (the request's `verbose: true`): the reply as /completion
    writes it; in a stream the text went out with the pieces (content "", no probabilities), as there."""
    out = result(served, index, done, prompt, settings, [], False)
    if settings["stream"]:
        out.pop("completion_probabilities", None)
        out["content"] = ""
    return out


def partial(index: int, chunk: CompletionChunk, produced: int, n_prompt: int) -> dict[str, Any]:
    """llama-server's partial result of one streamed piece (without its probabilities)."""
    return {"index": index, "content": chunk.text, "tokens": chunk.tokens, "stop": False, "id_slot": -1,
            "tokens_predicted": produced, "tokens_evaluated": n_prompt}


def _after_chain(lp: TokenLogprob, settings: dict[str, Any], post: bool) -> TokenLogprob:
    """post_sampling_probs of a greedy request: the chain leaves the one token, probability 1 (as llama-server).
    Otherwise the probabilities before the chain (the engine does not see the chain's candidates)."""
    if post and settings["temperature"] <= 0:
        return TokenLogprob(lp.token, lp.text, 0.0, ((lp.token, 0.0),))
    return lp


def timings(t: CompletionTimings) -> dict[str, float]:
    """llama-server's `timings` object, its rates too: the prompt's over the tokens decoded (not the cached ones),
    generation's over its decode steps, one fewer than the tokens (the first token comes from the prompt's last
    batch, and predicted_ms runs from it); a rate without a divisor is 0."""
    read, steps = t.prompt_tokens - t.cached_tokens, max(0, t.predicted_tokens - 1)
    return {"cache_n": t.cached_tokens, "prompt_n": read, "prompt_ms": t.prompt_ms,
            "prompt_per_token_ms": t.prompt_ms / read if read > 0 else 0.0,
            "prompt_per_second": 1e3 / t.prompt_ms * read if t.prompt_ms > 0 else 0.0,
            "predicted_n": t.predicted_tokens, "predicted_ms": t.predicted_ms,
            "predicted_per_token_ms": t.predicted_ms / steps if steps else 0.0,
            "predicted_per_second": 1e3 / t.predicted_ms * steps if t.predicted_ms > 0 else 0.0,
            # as llama-server: only when something was drafted
            **({"draft_n": t.drafted_tokens, "draft_n_accepted": t.accepted_tokens} if t.drafted_tokens else {})}


def so_far(job: Job, piece: CompletionChunk) -> CompletionTimings:
    """The timings of `job` now: its final chunk's, or what its fields say while it runs (timings_per_token)."""
    if piece.timings is not None:
        return piece.timings
    now = time.perf_counter()
    first = job.first_token or now
    return CompletionTimings(job.n_prompt, (first - job.started) * 1e3, job.produced, (now - first) * 1e3,
                             job.cached)


def _settings(sampling: SamplerParams, n_predict: int, body: NativeCompletionRequest) -> dict[str, Any]:
    return generation_settings(sampling, n_predict, body.stop, body.stream, body.ignore_eos)


def generation_settings(sampling: SamplerParams, n_predict: int, stop: str | list[str] | None, stream: bool,
                        ignore_eos: bool = False) -> dict[str, Any]:
    """`generation_settings`: the sampling a request ran with, in llama-server's names (a -inf bias is null, as
    llama-server's JSON writes it)."""
    return {"seed": sampling.seed, "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "min_p": sampling.min_p, "typical_p": sampling.typical_p,
            "repeat_last_n": sampling.penalty_last_n, "repeat_penalty": sampling.penalty_repeat,
            "presence_penalty": sampling.penalty_present, "frequency_penalty": sampling.penalty_freq,
            "stop": [stop] if isinstance(stop, str) else list(stop or []), "max_tokens": n_predict,
            "n_predict": n_predict, "stream": stream, "ignore_eos": ignore_eos,
            "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t}
                           for t, b in sampling.logit_bias.items()],
            "samplers": list(sampling.samplers)}


async def _events(served: Served, jobs: list[Job], texts: list[str], settings: dict[str, Any], post: bool = False,
                  per_token: bool = False) -> AsyncIterator[str]:
    """llama-server's stream: a partial result per piece (`per_token`: with the timings so far; a job with
    `progress`: a prompt_progress piece as its prompt is read), then each prompt's final one (no [DONE])."""
    pieces: list[list[CompletionChunk]] = [[] for _ in jobs]
    try:
        async for i, chunk in astream(served.llama.engine, jobs):
            if chunk.progress is not None:
                yield _event({**partial(i, chunk, 0, len(jobs[i].prompt)),
                              **({"timings": timings(chunk.timings)} if per_token and chunk.timings else {}),
                              "prompt_progress": progress_fields(chunk.progress)})
                continue
            pieces[i].append(chunk)
            if chunk.stop_reason is None:
                if chunk.text or chunk.tokens:
                    produced = sum(len(c.tokens) for c in pieces[i])
                    probs = {} if chunk.logprobs is None else {"completion_probabilities": [
                        token_entry(served.llama.model, _after_chain(lp, settings, post), post)
                        for lp in chunk.logprobs]}
                    per = {"timings": timings(so_far(jobs[i], chunk))} if per_token else {}
                    yield _event({**partial(i, chunk, produced, len(jobs[i].prompt)), **probs, **per})
                continue
            done = collect_many([(0, c) for c in pieces[i]], [jobs[i]])[0]
            final = result(served, i, done, texts[i], {**settings, "stream": True}, settings["stop"], False)
            final.pop("completion_probabilities", None)  # (each went with its token)
            yield _event({**final, "content": chunk.text})
    except LlamaError as exc:  # the status line is sent: the error is the last event
        yield NATIVE.stream_error(exc)


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def chat_prompt_tokens(served: Served, chat: ChatRequest) -> int:
    """How many tokens `chat`'s messages (and tools) are, rendered by the model's chat template (ChatRun's count,
    with the server's chat defaults)."""
    spec = ChatSpec(chat.messages, tools=chat.tools, tool_choice=chat.tool_choice, **served.chat_options())
    return ChatRun(served.llama, ChatCall(spec, allow_empty=True)).prompt_tokens()
