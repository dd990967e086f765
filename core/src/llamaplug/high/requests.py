"""Requests for the engine, built from a caller's arguments, and their results: what every face of a Llama shares.

A caller (Llama's own methods, AsyncLlama, an HTTP route) turns its arguments into
`Job`s here, runs them with the pump in events.py, and joins each job's chunks into a
`Completion` with `collect`:

    job = completion_job(llama, "Once upon", max_tokens=32)
    done = collect(events.gather_chunks(llama.engine, job), job.prompt)

Every check runs while the job is built, in the caller's thread: a bad argument is
raised to the caller and never reaches the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..blocks.grammar import Grammar
from ..blocks.sampling import LlamaSampler, SamplerChain
from ..errors import ContextOverflowError, InvalidParameterError
from ..params import SamplerParams
from ..plugin_api import MediaPrompt
from .chat import check_messages, render, render_prompt
from .chat_template import require_tools_rendered
from .completion import Completion, CompletionChunk, TokenLogprob
from .engine import Job
from .structured import ResponseFormat, as_response_format
from .tool_calls import check_tools, grammar_for
from .tool_calls import family as tool_family
from .tool_schema import ToolSpec

if TYPE_CHECKING:
    from .llama import Llama

# What create_completions takes as `sampler`: one per prompt, a factory, sampling params, or None (greedy).
Samplers = LlamaSampler | SamplerParams | Callable[[], LlamaSampler] | Sequence[LlamaSampler] | None


def completion_job(llama: Llama, prompt: str | list[int], max_tokens: int | None = 16,
                   sampler: LlamaSampler | None = None, stop: str | list[str] | None = None,
                   logprobs: int | None = None, special: bool = False, response_format: ResponseFormat | None = None,
                   own_sampler: bool = False) -> Job:
    """A checked completion of `prompt` (text, token ids, or a multimodal plugin's chunks); see Llama.create_completion.

    `own_sampler=True`: the job closes `sampler` when it ends (it was made for this job alone).
    """
    model = llama.model
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0):
        raise InvalidParameterError(f"max_tokens must be a non-negative int or None, got {max_tokens!r}",
                                    field="max_tokens")
    if logprobs is not None and not 0 <= logprobs <= model.n_vocab:
        raise InvalidParameterError(f"logprobs must be in 0..n_vocab, got {logprobs}", field="logprobs")
    if stop is not None and not isinstance(stop, str) and not all(isinstance(s, str) for s in stop):
        raise InvalidParameterError("stop must be a string or a list of strings", field="stop")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
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
        raise ContextOverflowError(
            f"the prompt has {n_prompt} {'positions' if media is not None else 'tokens'} but a sequence holds "
            f"{room} ({per}); shorten the prompt or raise n_ctx"
        )
    grammar = response_grammar(response_format)
    if grammar is not None:
        if sampler is not None and not isinstance(sampler, SamplerChain):
            raise InvalidParameterError("response_format needs a SamplerChain (or no sampler)", field="sampler")
        sampler = (sampler if sampler is not None else SamplerChain().greedy()).constrained(grammar)
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
                    special: bool = False, response_format: ResponseFormat | None = None) -> list[Job]:
    """One checked job per prompt, each with its own sampler (see samplers_for)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise InvalidParameterError("prompts must be a list of prompts (text or token ids)", field="prompts")
    return [completion_job(llama, p, max_tokens, s, stop, logprobs, special, response_format, own)
            for p, (s, own) in zip(prompts, samplers_for(llama, len(prompts), sampler))]


def chat_job(llama: Llama, messages: list[dict[str, Any]], max_tokens: int | None = None,
             sampler: LlamaSampler | None = None, stop: str | list[str] | None = None,
             tools: list[ToolSpec] | None = None, tool_choice: str | dict[str, Any] | None = None,
             response_format: ResponseFormat | None = None, chat_template: str | None = None,
             own_sampler: bool = False) -> tuple[Job, str | None]:
    """A checked reply to `messages` (see Llama.create_chat_completion), and the tool-call family to parse it with.

    The family (None without tools) goes to chat.as_chat / ChatStream with the job's chunks.
    """
    prompt, sampler, kind = _chat_prompt(llama, messages, sampler, tools, tool_choice, response_format, chat_template)
    return completion_job(llama, prompt, max_tokens, sampler, stop, None, False, response_format, own_sampler), kind


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
                              chunk.timings, chunk.stop_reason, prompt)
    raise AssertionError("generation ended without a final chunk")


def collect_many(events: Iterable[tuple[int, CompletionChunk]], jobs: Sequence[Job]) -> list[Completion]:
    """The Completion of each job, in the jobs' order, from (index, chunk) events as events.stream gives them."""
    streams: list[list[CompletionChunk]] = [[] for _ in jobs]
    for i, chunk in events:
        streams[i].append(chunk)
    return [collect(chunks, job.prompt) for chunks, job in zip(streams, jobs)]


def response_grammar(response_format: ResponseFormat | None) -> Grammar | None:
    """The grammar an OpenAI-shaped response_format (or a pydantic model) asks for (None: free text)."""
    response_format = as_response_format(response_format)
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or "type" not in response_format:
        raise InvalidParameterError('response_format must be a dict with a "type"', field="response_format")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema", {"type": "object"})
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise InvalidParameterError('response_format json_schema needs {"json_schema": {"schema": {...}}}',
                                        field="response_format.json_schema")
        schema = spec["schema"]
    else:
        raise InvalidParameterError(f"response_format type {kind!r} is not text, json_object or json_schema",
                                    field="response_format.type")
    return Grammar.from_json_schema(schema)


def _chat_prompt(llama: Llama, messages: list[dict[str, Any]], sampler: LlamaSampler | None,
                 tools: list[ToolSpec] | None, tool_choice: str | dict[str, Any] | None,
                 response_format: ResponseFormat | None, chat_template: str | None
                 ) -> tuple[Any, LlamaSampler | None, str | None]:
    """The rendered prompt, the sampler (constrained for a forced tool call) and the tool-call family."""
    if tool_choice not in (None, "auto", "none", "required") and not isinstance(tool_choice, dict):
        raise InvalidParameterError(f'tool_choice must be "auto", "none", "required" or {{"type": "function", '
                                    f'"function": {{"name": ...}}}}, got {tool_choice!r}', field="tool_choice")
    if tools is not None:
        tools = check_tools(tools)
    elif tool_choice not in (None, "auto", "none"):
        raise InvalidParameterError("tool_choice needs tools", field="tool_choice")
    use_tools = tools is not None and tool_choice != "none"
    projector = llama.projector
    if projector is not None and projector.has_media(messages):
        tokens, template = projector.chat_prompt(messages, lambda flat: render_prompt(
            llama, check_messages(flat), chat_template, tools if use_tools else None))
    else:
        tokens, template = render(llama, check_messages(messages), chat_template, tools if use_tools else None)
    if use_tools and tool_choice in (None, "auto"):  # a forced call has its grammar: the call happens anyway
        require_tools_rendered(template, llama.model.path.name)
    kind = tool_family(template) if use_tools else None
    if use_tools and tool_choice not in (None, "auto"):
        if response_format is not None:
            raise InvalidParameterError("a forced tool call and response_format exclude each other",
                                        field="response_format")
        grammar = Grammar(grammar_for(tools, tool_choice, kind))
        sampler = (sampler if sampler is not None else SamplerChain().greedy())
        if not isinstance(sampler, SamplerChain):
            raise InvalidParameterError("a forced tool call needs a SamplerChain (or no sampler)", field="sampler")
        sampler = sampler.constrained(grammar)
    return tokens, sampler, kind


def _is_media(prompt: Any) -> bool:
    return isinstance(prompt, MediaPrompt)  # what a Projector's chat_prompt made
