"""The engine's jobs, built from a caller's arguments, and their results: what every face of a Llama shares.

A caller (Llama's own methods, AsyncLlama, an HTTP route) turns its arguments into
`Job`s here, runs them with the pump in events.py, and joins each job's chunks into a
`Completion` with `collect`:

    job = completion_job(llama, "Once upon", max_tokens=32)
    done = collect(events.gather_chunks(llama.engine, job), job.prompt)

A chat's job is built by prepare_chat, for chat_call.ChatRun (every face's one way to a
chat). Every check runs while the job is built, in the caller's thread: a bad argument is
raised to the caller and never reaches the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..blocks.chat_layer import grammar_triggers, preserved_tokens
from ..blocks.grammar import Grammar
from ..blocks.sampling import LlamaSampler, SamplerChain
from ..blocks.tool_choice import tag_as_tokens
from ..errors import ContextOverflowError, InvalidParameterError
from ..params import SamplerParams
from ..plugin_api import MediaPrompt
from .chat import ChatPlan, ChatSpec, check_messages, plan_chat, response_schema
from .completion import Completion, CompletionChunk, TokenLogprob, check_stops
from .engine import Job
from .structured import ResponseFormat, constrain, engine_for

if TYPE_CHECKING:
    from .llama import Llama

MAX_TOKENS = 2**31 - 1  # as llama-server, which refuses a larger n_predict with a 400

# What create_completions takes as `sampler`: one per prompt, a factory, sampling params, or None (greedy).
Samplers = LlamaSampler | SamplerParams | Callable[[], LlamaSampler] | Sequence[LlamaSampler] | None


def completion_job(llama: Llama, prompt: str | list[int], max_tokens: int | None = 16,
                   sampler: LlamaSampler | None = None, stop: str | list[str] | None = None,
                   logprobs: int | None = None, special: bool = False, response_format: ResponseFormat | None = None,
                   own_sampler: bool = False, structured_engine: str | None = None,
                   grammar: str | None = None) -> Job:
    """A checked completion of `prompt` (text, token ids, or a multimodal plugin's chunks); see Llama.create_completion.

    `own_sampler=True`: the job closes `sampler` when it ends (it was made for this job alone).
    `structured_engine`: what constrains to response_format's schema or to `grammar` (GBNF, or Lark under
    llguidance: structured.py; None: the Llama's engine).
    """
    model = llama.model
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or not 0 <= max_tokens <= MAX_TOKENS):
        raise InvalidParameterError(f"max_tokens must be an int in 0..{MAX_TOKENS} (llama.cpp's n_predict is a "
                                    f"32-bit int) or None, got {max_tokens!r}", field="max_tokens")
    if logprobs is not None and not 0 <= logprobs <= model.n_vocab:
        raise InvalidParameterError(f"logprobs must be in 0..n_vocab, got {logprobs}", field="logprobs")
    stops = check_stops(stop)
    media = None
    if _is_media(prompt):
        media, tokens = prompt, []
    elif isinstance(prompt, str):
        tokens = model.tokenize(prompt, True, special)
    else:
        tokens = model.check_tokens(prompt).tolist()
    n_prompt = len(tokens) if media is None else int(media.n_pos)
    if not n_prompt:
        raise InvalidParameterError("the prompt has no tokens", field="prompt")
    room = llama.engine.n_ctx_seq
    if n_prompt >= room:
        per = f"n_ctx / n_seq_max = {room}" if room != llama.context.n_ctx else f"n_ctx = {room}"
        overflow = ContextOverflowError(
            f"the prompt has {n_prompt} {'positions' if media is not None else 'tokens'} but a sequence holds "
            f"{room} ({per}); shorten the prompt or raise n_ctx"
        )
        overflow.n_prompt_tokens, overflow.n_ctx = n_prompt, room  # for the server's exceed_context_size_error
        raise overflow
    engine = engine_for(llama.params.structured_engine, structured_engine)
    schema = None if response_format is None else response_schema(response_format)
    if schema is not None and grammar is not None:
        raise InvalidParameterError("response_format (or json_schema) and grammar exclude each other", field="grammar")
    if schema is not None or grammar is not None:
        sampler = constrain(model, sampler, engine, json_schema=schema, grammar=grammar,
                            field="response_format" if grammar is None else "grammar")
        own_sampler = True
    if sampler is None:
        sampler, own_sampler = SamplerChain().greedy(), True
    elif isinstance(sampler, SamplerChain):
        sampler.select_with(llama.params.seed)  # for the dist appended to a chain that selects nothing
    if isinstance(sampler, SamplerChain) and not sampler.closed:
        sampler.prepare(model)  # a bad option is the caller's error, raised here
    return Job(tokens, max_tokens, sampler, stops, logprobs, own_sampler, media=media)


def completion_jobs(llama: Llama, prompts: Sequence[str | list[int]], max_tokens: int | None = 16,
                    sampler: Samplers = None, stop: str | list[str] | None = None, logprobs: int | None = None,
                    special: bool = False, response_format: ResponseFormat | None = None,
                    structured_engine: str | None = None, grammar: str | None = None) -> list[Job]:
    """One checked job per prompt, each with its own sampler (see samplers_for)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise InvalidParameterError("prompts must be a list of prompts (text or token ids)", field="prompts")
    return [completion_job(llama, p, max_tokens, s, stop, logprobs, special, response_format, own, structured_engine,
                           grammar)
            for p, (s, own) in zip(prompts, samplers_for(llama, len(prompts), sampler))]


def prepare_chat(llama: Llama, spec: ChatSpec, max_tokens: int | None = None, sampler: LlamaSampler | None = None,
                 stop: str | list[str] | None = None, own_sampler: bool = False, logprobs: int | None = None,
                 *, allow_empty: bool = False) -> tuple[Job, ChatPlan]:
    """The job of one chat request (see Llama.create_chat_completion), with the prompt, grammar, stops and special
    tokens llama.cpp's chat layer gives for it, and the plan to read the reply with (chat.as_chat / ChatStream).

    Every face (Llama, AsyncLlama, every HTTP API, Ray replicas) comes here through chat_call.ChatRun. `logprobs`:
    the most likely tokens to give with each sampled one's log probability (None: none). `allow_empty`: no
    messages at all is the template's own prompt (its generation prompt), as llama-server answers an empty
    list, instead of an error. `own_sampler=True`: the job closes `sampler` when it ends."""
    model = llama.model
    budget = _check_budget(spec)
    spec, constraint = _own_constraint(llama, spec)
    projector = llama.projector
    if projector is not None and projector.has_media(spec.messages):
        prompt, plan = projector.chat_prompt(spec.messages, lambda flat: _render(llama, spec, flat))
    else:
        empty = allow_empty and isinstance(spec.messages, list) and not spec.messages
        plan = plan_chat(llama, spec, [] if empty else None)
        prompt = model.tokenize(plan.params["prompt"], model.add_bos, special=True)
    params = plan.params

    def tokenize(text: str) -> list[int]:
        return model.tokenize(text, False, True)

    start = params["thinking_start_tag"] or ""
    if budget >= 0 and params["grammar"] and not params["grammar_lazy"] and any(params["thinking_end_tags"]) \
            and start not in (params["generation_prompt"] or ""):
        # the budget starts at the thinking start tag's tokens, the model writes the tag: the grammar takes it as
        # those tokens (tool_choice.tag_as_tokens; a tag the prompt holds is the budget's prefill)
        params["grammar"] = tag_as_tokens(params["grammar"], start, tokenize(start))
    if params["grammar"]:
        sampler = sampler if sampler is not None else SamplerChain().greedy()
        if not isinstance(sampler, SamplerChain):
            raise InvalidParameterError("tools or response_format need a SamplerChain (or no sampler)",
                                        field="sampler")
        if params["grammar_lazy"]:
            patterns, triggers = grammar_triggers(params, tokenize)
            sampler = sampler.constrained(params["grammar"], trigger_patterns=patterns, trigger_tokens=triggers)
        else:
            sampler = sampler.constrained(params["grammar"], prefill=_prefill_tokens(model, params))
        own_sampler = True
    if constraint is not None:
        plan.response_format = constraint.pop("response_format")
        sampler = constrain(model, sampler, **constraint)
        own_sampler = True
    if budget >= 0 and params["thinking_start_tag"] and any(params["thinking_end_tags"]):
        sampler = _with_budget(model, params, sampler, own_sampler, budget, spec.reasoning_budget_message or "")
        own_sampler = True
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    job = completion_job(llama, prompt, max_tokens, sampler, stops + list(params["additional_stops"]), logprobs,
                         False, None, own_sampler)
    job.render_special = frozenset(preserved_tokens(params, tokenize))
    job.text.whole_chars = True  # the reply's parser reads whole characters (TextAssembler)
    return job, plan


def _own_constraint(llama: Llama, spec: ChatSpec) -> tuple[ChatSpec, dict[str, Any] | None]:
    """`spec` for the chat layer, and the constraint to put in front of the sampler here instead (None: the chat
    layer's GBNF grammar, as llama-server). Under llguidance the reply's schema or grammar is llguidance's and the
    chat layer renders the prompt without it; tool calls keep the chat layer's grammar (lazy, from the template's
    call marker on: llama.cpp builds it as GBNF and llguidance has no lazy triggers), so a request with tools is
    GBNF's whole: "auto" takes gbnf there, and "llguidance" asked for with a schema or grammar is refused."""
    engine = engine_for(llama.params.structured_engine, spec.structured_engine)
    schema = None if spec.response_format is None else response_schema(spec.response_format)
    schema = spec.json_schema if schema is None else schema
    if engine == "gbnf" or (schema is None and spec.grammar is None):
        return spec, None
    if schema is not None and spec.grammar is not None:
        raise InvalidParameterError("json_schema (or response_format) and grammar exclude each other", field="grammar")
    if spec.tools and spec.tool_choice != "none":
        asked = spec.structured_engine if spec.structured_engine is not None else llama.params.structured_engine
        if asked == "auto":
            return spec, None
        raise InvalidParameterError('with tools, the reply\'s grammar is the chat layer\'s (GBNF, its tool-call '
                                    'grammar): structured_engine "llguidance" cannot constrain it; use "gbnf" or '
                                    '"auto"', field="structured_engine")
    if spec.grammar is not None and not isinstance(spec.grammar, str):
        raise InvalidParameterError("grammar must be GBNF text", field="grammar")
    bare = dataclasses.replace(spec, response_format=None, json_schema=None, grammar=None)
    return bare, {"engine": engine, "json_schema": schema, "grammar": spec.grammar,
                  "field": "grammar" if schema is None else "response_format",
                  "response_format": spec.response_format}


def _check_budget(spec: ChatSpec) -> int:
    """The request's reasoning budget (-1: unlimited), checked before anything is rendered."""
    budget = spec.reasoning_budget_tokens
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                               or not -1 <= budget <= MAX_TOKENS):
        raise InvalidParameterError(f"reasoning_budget_tokens must be an int in -1..{MAX_TOKENS} (-1: unlimited, "
                                    f"0: no thinking), got {budget!r}", field="reasoning_budget_tokens")
    if spec.reasoning_budget_message is not None and not isinstance(spec.reasoning_budget_message, str):
        raise InvalidParameterError("reasoning_budget_message must be text", field="reasoning_budget_message")
    return -1 if budget is None else budget


def _with_budget(model: Any, params: dict[str, Any], sampler: LlamaSampler | None, owned: bool, budget: int,
                 message: str) -> SamplerChain:
    """`sampler` with llama-server's reasoning budget in front (tools/server: the template's thinking tags, the
    message's tokens then the first end tag's forced when the budget is spent; the generation prompt read first)."""
    sampler = sampler if sampler is not None else SamplerChain().greedy()
    if not isinstance(sampler, SamplerChain):
        raise InvalidParameterError("reasoning_budget_tokens needs a SamplerChain (or no sampler)", field="sampler")
    if not owned:
        sampler = sampler.twin()  # the caller's chain stays as it was given

    def tokenize(text: str) -> list[int]:
        return model.tokenize(text, False, True)

    ends = [tokenize(tag) for tag in params["thinking_end_tags"] if tag]
    return sampler.reasoning_budget(tokenize(params["thinking_start_tag"]), ends, tokenize(message) + ends[0],
                                    budget, _budget_prefill(model, params))


def _budget_prefill(model: Any, params: dict[str, Any]) -> list[int]:
    """The generation prompt's tokens for the reasoning budget, with a thinking block it opens tokenized on its own:
    the budget finds the start tag by its tokens, and the prompt's text before it can merge with it ("|><|" in
    Cohere's "<|CHATBOT_TOKEN|><|START_THINKING|>" for SmolLM2), so the budget never started there."""
    text, start = params["generation_prompt"], params["thinking_start_tag"]
    at = text.rfind(start)
    if at < 0 or any(end and end in text[at:] for end in params["thinking_end_tags"]):
        return _prefill_tokens(model, params)
    before = _prefill_tokens(model, {"generation_prompt": text[:at]})
    return before + model.tokenize(start, False, True) + model.tokenize(text[at + len(start):], False, True)


def _render(llama: Llama, spec: ChatSpec, flat: list[dict[str, Any]]) -> tuple[str, ChatPlan]:
    plan = plan_chat(llama, spec, check_messages(flat))
    return plan.params["prompt"], plan


def _prefill_tokens(model: Any, params: dict[str, Any]) -> list[int]:
    """The generation prompt's tokens, for a grammar that starts at the template's generation prompt
    (common/sampling.cpp: a leading space some tokenizers add before a special token is left out)."""
    text = params["generation_prompt"]
    if not text:
        return []
    tokens = model.tokenize(text, False, True)
    if tokens and not text[0].isspace():
        first = model.token_to_piece(tokens[0], True)
        if first[:1].isspace():
            tokens = tokens[1:]
    return tokens


def samplers_for(llama: Llama, n: int, sampler: Samplers) -> list[tuple[LlamaSampler | None, bool]]:
    """(sampler, owned) for each of `n` requests; an owned one was made here and its job closes it."""
    if sampler is None:
        return [(None, False)] * n
    if isinstance(sampler, SamplerParams):
        return [(sampler.build_chain(llama.model), True) for _ in range(n)]
    if isinstance(sampler, LlamaSampler):
        if n > 1:
            raise InvalidParameterError("one sampler object cannot serve several prompts (it has state): pass "
                                        "a list, a SamplerParams or a factory", field="sampler")
        return [(sampler, False)]
    if callable(sampler):
        made = [sampler() for _ in range(n)]
        if not all(isinstance(s, LlamaSampler) for s in made):
            raise InvalidParameterError("the sampler factory must return LlamaSampler objects", field="sampler")
        return [(s, True) for s in made]
    given = list(sampler)
    if len(given) != n or not all(isinstance(s, LlamaSampler) for s in given):
        raise InvalidParameterError(f"sampler: a list needs one LlamaSampler per prompt ({n})", field="sampler")
    if len({id(s) for s in given}) != n:
        raise InvalidParameterError("sampler: the same sampler object appears twice in the list", field="sampler")
    return [(s, False) for s in given]


def collect(chunks: Iterable[CompletionChunk], prompt: list[int]) -> Completion:
    """The Completion that one job's chunks make (up to its final chunk)."""
    parts: list[str] = []
    tokens: list[int] = []
    logprobs: list[TokenLogprob] = []
    want_logprobs = False
    for chunk in chunks:
        parts.append(chunk.text)
        tokens.extend(chunk.tokens)
        if chunk.logprobs is not None:
            want_logprobs = True
            logprobs.extend(chunk.logprobs)
        if chunk.stop_reason is not None:
            assert chunk.timings is not None
            return Completion("".join(parts), tokens, logprobs if want_logprobs else None,
                              chunk.timings, chunk.stop_reason, prompt, chunk.stop_string)
    raise AssertionError("generation ended without a final chunk")


def collect_many(events: Iterable[tuple[int, CompletionChunk]], jobs: Sequence[Job]) -> list[Completion]:
    """The Completion of each job, in the jobs' order, from (index, chunk) events as events.stream gives them."""
    streams: list[list[CompletionChunk]] = [[] for _ in jobs]
    for i, chunk in events:
        streams[i].append(chunk)
    return [collect(chunks, job.prompt) for chunks, job in zip(streams, jobs)]


def response_grammar(response_format: ResponseFormat | None) -> Grammar | None:
    """The grammar an OpenAI-shaped response_format (or a pydantic model) asks for (None: free text)."""
    if response_format is None:
        return None
    schema = response_schema(response_format)
    return None if schema is None else Grammar.from_json_schema(schema)


def _is_media(prompt: Any) -> bool:
    return isinstance(prompt, MediaPrompt)  # what a Projector's chat_prompt made
