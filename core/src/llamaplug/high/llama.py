"""Llama: the orchestrator that owns a model, a context and the generation loop."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import plugins
from ..blocks import _native_log
from ..blocks.adapters import LoraAdapter
from ..blocks.backend import LlamaBackend
from ..blocks.context import LlamaContext
from ..blocks.grammar import Grammar
from ..blocks.model import LlamaModel
from ..blocks.sampling import LlamaSampler, SamplerChain
from ..errors import ContextOverflowError, InvalidParameterError
from ..params import LlamaParams, SamplerParams
from ..plugin_api import MediaPrompt, Projector
from . import saved_state
from .chat import ChatCompletion, ChatCompletionChunk, as_chat, as_chunks, check_messages, render, render_prompt
from .completion import Completion, CompletionChunk, TokenLogprob
from .embeddings import embed, rerank
from .engine import Engine, Job
from .infill import check_text, infill_tokens
from .tool_calls import check_tools, grammar_for
from .tool_calls import family as tool_family

# What create_completions takes as `sampler`: one per prompt, a factory, sampling params, or None (greedy).
Samplers = LlamaSampler | SamplerParams | Callable[[], LlamaSampler] | Sequence[LlamaSampler] | None


class Llama:
    """Model + context + the engine that runs every generation on them.

    Generations from any number of threads share the engine's batches: with
    n_seq_max=N, N sequences decode together (continuous batching, engine.py);
    more wait for a free slot. `create_completions` runs many prompts at once.
    """

    def __init__(self, params: LlamaParams, backend: LlamaBackend, model: LlamaModel, context: LlamaContext):
        self.params = params
        self.backend = backend
        self._model = model
        self._context = context
        self._engine = Engine(context, params.cache_ram_mib << 20)
        self._embed_lock = threading.Lock()  # the embedding contexts are not the engine's
        self._mtmd: Projector | None = None  # a plugin's, when LlamaParams.mmproj_path is set (llamaplug-mtmd)

    @classmethod
    def load(cls, params: LlamaParams | str) -> Llama:
        if not isinstance(params, LlamaParams):
            params = LlamaParams(model_path=params)
        _native_log.set_level(params.log_level)
        bar = None
        if params.progress_callback is None and (params.progress or (params.progress is None and _stderr_is_tty())):
            bar = _progress_bar(params.model_path.name)
            params = params.replace(progress_callback=bar.update_to)
        backend = LlamaBackend.init(params.backends)
        for endpoint in params.rpc_servers:
            backend.add_rpc_server(endpoint)
        model = LlamaModel(params.model_path, params.model_params(), params.context_params())
        # The fit sized the context that n_ctx=0 left to it (as llama-cli does).
        context_params = model.fit.context if model.fit is not None else params.context_params()
        if bar is not None:
            bar.close()
        try:
            context = LlamaContext(model, context_params)
            for path, scale in params.lora:
                context.set_lora(LoraAdapter.load(model, path), scale)
            mtmd = _projector(params, model)
        except BaseException:
            model.close()
            raise
        llama = cls(params, backend, model, context)
        llama._mtmd = mtmd
        return llama

    @property
    def model(self) -> LlamaModel:
        return self._model

    @property
    def context(self) -> LlamaContext:
        """The engine's context: read it between generations, never while one runs."""
        return self._context

    @property
    def engine(self) -> Engine:
        return self._engine

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self._model.tokenize(text, add_bos, special)

    def detokenize(self, tokens: Any, special: bool = False) -> str:
        return self._model.detokenize(tokens, special)

    def cancel(self) -> None:
        """Stop every running and waiting generation (from any thread): StopReason.CANCELLED.

        A decode running now stops between graph nodes; later generations are not affected.
        """
        self._engine.cancel_all()

    def close(self) -> None:
        """Stop the engine and free the model, contexts and KV cache now."""
        self._engine.close()
        self._model.close()  # closes the contexts first

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state -----------------------------------------------------------------
    def save_state(self, path: str | os.PathLike[str] | None = None) -> bytes | Path:
        """The KV cache and the slots' tokens (for prefix reuse), as bytes, or written to `path`.

        Taken between requests. The model's identity goes with it: load_state refuses
        a state of another model (saved_state.py).
        """
        with self._engine.idle("save_state") as slots:
            data = saved_state.pack(self, [list(s) for s in slots], self._context.state_get())
        if path is None:
            return data
        target = Path(path)
        target.write_bytes(data)
        return target

    def load_state(self, state: bytes | str | os.PathLike[str]) -> None:
        """Restore what save_state gave (bytes or a file): the next prompts reuse its tokens."""
        saved, native = saved_state.unpack(self, state)
        with self._engine.idle("load_state") as slots:
            for mine in slots:
                mine.clear()  # if llama.cpp refuses the state, the cache is in an unknown state
            self._context.state_set(native)
            for mine, tokens in zip(slots, saved):
                mine.extend(tokens)

    # -- completion ------------------------------------------------------------
    def create_completion(
        self,
        prompt: str | list[int],
        max_tokens: int | None = 16,
        sampler: LlamaSampler | None = None,
        stop: str | list[str] | None = None,
        stream: bool = False,
        logprobs: int | None = None,
        special: bool = False,
        response_format: dict[str, Any] | None = None,
    ) -> Completion | Iterator[CompletionChunk]:
        """Complete `prompt` (text, or token ids).

        max_tokens=None generates until EOS or a full context. The default
        sampler is greedy; a SamplerChain that ends without a selecting sampler
        gets dist(LlamaParams.seed) appended (unless it was given its own
        seed). `special=True` parses control-token text in the prompt. With
        stream=True, returns an iterator of CompletionChunk whose texts join to
        the non-streamed text. `response_format` (OpenAI's shapes:
        {"type": "json_object"} for any JSON object, {"type": "json_object",
        "schema": {...}} or {"type": "json_schema", "json_schema": {"schema":
        {...}}}) puts the schema's grammar in front of the sampler chain.
        """
        job = self._job(prompt, max_tokens, sampler, stop, logprobs, special, response_format)
        return self._stream_one(job) if stream else _collect(self._stream_one(job), job.prompt)

    def create_completions(
        self,
        prompts: Sequence[str | list[int]],
        max_tokens: int | None = 16,
        sampler: Samplers = None,
        stop: str | list[str] | None = None,
        stream: bool = False,
        logprobs: int | None = None,
        special: bool = False,
        response_format: dict[str, Any] | None = None,
    ) -> list[Completion] | Iterator[tuple[int, CompletionChunk]]:
        """Complete every prompt, n_seq_max at a time in shared batches; results in the prompts' order.

        `sampler`: None (greedy), a SamplerParams (one chain each), a callable returning a
        fresh sampler, or a list with one sampler per prompt (a sampler has state, so one
        object cannot serve two prompts). With stream=True, yields (index, chunk) as they come.
        """
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise InvalidParameterError("prompts must be a list of prompts (text or token ids)", field="prompts")
        chains = self._samplers_for(len(prompts), sampler)
        jobs = [self._job(p, max_tokens, s, stop, logprobs, special, response_format, own)
                for p, (s, own) in zip(prompts, chains)]
        if stream:
            return self._stream(jobs)
        return _collect_many(self._stream(jobs), jobs)

    def _samplers_for(self, n: int, sampler: Samplers) -> list[tuple[LlamaSampler | None, bool]]:
        if sampler is None:
            return [(None, False)] * n
        if isinstance(sampler, SamplerParams):
            return [(sampler.build_chain(self._model), True) for _ in range(n)]
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

    def _job(self, prompt: str | list[int], max_tokens: int | None, sampler: LlamaSampler | None,
             stop: str | list[str] | None, logprobs: int | None, special: bool,
             response_format: dict[str, Any] | None, own: bool = False) -> Job:
        """A checked request for the engine (every error is raised here, in the caller's thread)."""
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 0):
            raise InvalidParameterError(f"max_tokens must be a non-negative int or None, got {max_tokens!r}",
                                        field="max_tokens")
        if logprobs is not None and not 0 <= logprobs <= self._model.n_vocab:
            raise InvalidParameterError(f"logprobs must be in 0..n_vocab, got {logprobs}", field="logprobs")
        if stop is not None and not isinstance(stop, str) and not all(isinstance(s, str) for s in stop):
            raise InvalidParameterError("stop must be a string or a list of strings", field="stop")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        media = None
        if _is_media(prompt):
            media, tokens = prompt, []
        elif isinstance(prompt, str):
            tokens = self._model.tokenize(prompt, True, special)
        else:
            tokens = self._model.check_tokens(prompt).tolist()
        n_prompt = len(tokens) if media is None else int(media.n_pos)
        if not n_prompt:
            raise InvalidParameterError("the prompt has no tokens", field="prompt")
        room = self._engine.n_ctx_seq
        if n_prompt >= room:
            per = f"n_ctx / n_seq_max = {room}" if room != self._context.n_ctx else f"n_ctx = {room}"
            raise ContextOverflowError(
                f"the prompt has {n_prompt} {'positions' if media is not None else 'tokens'} but a sequence holds "
                f"{room} ({per}); shorten the prompt or raise n_ctx"
            )
        grammar = response_grammar(response_format)
        if grammar is not None:
            if sampler is not None and not isinstance(sampler, SamplerChain):
                raise InvalidParameterError("response_format needs a SamplerChain (or no sampler)", field="sampler")
            sampler = (sampler if sampler is not None else SamplerChain().greedy()).constrained(grammar)
            own = True
        if sampler is None:
            sampler, own = SamplerChain().greedy(), True
        elif isinstance(sampler, SamplerChain):
            sampler.select_with(self.params.seed)  # for the dist appended to a chain that selects nothing
        if isinstance(sampler, SamplerChain) and not sampler.closed:
            sampler.prepare(self._model)  # a bad option is the caller's error, raised here
        return Job(tokens, max_tokens, sampler, stops, logprobs, own, media=media)

    def _stream(self, jobs: list[Job]) -> Iterator[tuple[int, CompletionChunk]]:
        """Submit `jobs` (at the first next()) and yield (index, event) until each has ended.

        Leaving early (break, close, an exception) cancels what has not ended: their slots
        are free at the engine's next step.
        """
        events: queue.SimpleQueue[tuple[int, CompletionChunk | BaseException]] = queue.SimpleQueue()
        for i, job in enumerate(jobs):
            job.sink = _Sink(events, i)
        for job in jobs:
            self._engine.submit(job)
        left = len(jobs)
        try:
            while left:
                i, event = events.get()
                if isinstance(event, BaseException):
                    raise event
                if event.stop_reason is not None:
                    left -= 1
                yield i, event
        finally:
            if left:
                for job in jobs:
                    job.cancel()
                self._engine.wake()

    def _stream_one(self, job: Job) -> Iterator[CompletionChunk]:
        for _, chunk in self._stream([job]):
            yield chunk

    def create_infill(self, prefix: str, suffix: str, max_tokens: int | None = 64, sampler: LlamaSampler | None = None,
                      stop: str | list[str] | None = None, stream: bool = False,
                      extra: list[dict[str, str]] | None = None, spm: bool = False
                      ) -> Completion | Iterator[CompletionChunk]:
        """The text between `prefix` and `suffix`, from the model's FIM tokens (see infill.py for the layout).

        `extra` chunks ({"filename", "text"}) go before, as repository context. Generation ends
        at an end-of-generation token (FIM models end the middle with one) or max_tokens.
        """
        tokens = infill_tokens(self._model, check_text(prefix, "prefix"), check_text(suffix, "suffix"), extra, spm)
        return self.create_completion(tokens, max_tokens, sampler, stop, stream)

    def embed(self, texts: list[str], normalize: bool = True, pooling: str | None = None,
              truncate: bool = False) -> np.ndarray | list[np.ndarray]:
        """Embeddings of `texts`: an (n, n_embd) array, or with pooling="none" one (tokens, n_embd) array each.

        `pooling` is "mean", "cls", "last" or "none" (default: the model's own, as
        llama-embedding). Many texts go into each llama_decode. normalize=True divides
        by the L2 norm. A text longer than the embedding context is a ContextOverflowError
        naming its index, or cut to fit with truncate=True.
        """
        with self._embed_lock:
            return embed(self, texts, normalize, pooling, truncate)

    def rerank(self, query: str, documents: list[str], truncate: bool = False) -> np.ndarray:
        """Relevance scores of `documents` for `query` (a rank-pooling model: a reranker), in their order."""
        with self._embed_lock:
            return rerank(self, query, documents, truncate)

    def create_chat_completion(
        self,
        messages: list[dict[str, Any]],
        max_tokens: int | None = None,
        sampler: LlamaSampler | None = None,
        stop: str | list[str] | None = None,
        stream: bool = False,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        response_format: dict[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> ChatCompletion | Iterator[ChatCompletionChunk]:
        """Reply to `messages` (OpenAI's shape) through the model's own chat template.

        `chat_template` overrides it (a Jinja template, or a name llama.cpp knows:
        chat_template.builtin_names()); a GGUF without one uses llama.cpp's chatml.
        `tools` go to the template and calls in the reply come back as
        message.tool_calls (formats: tool_calls.py); tool_choice "required" or a named
        function is enforced by a grammar. max_tokens=None generates until the end of the turn.
        """
        tokens, sampler, kind = self._chat_prompt(messages, sampler, tools, tool_choice, response_format, chat_template)
        name = self.params.model_path.name
        out = self.create_completion(tokens, max_tokens, sampler, stop, stream, response_format=response_format)
        if stream:
            assert not isinstance(out, Completion)
            return as_chunks(out, name, kind)
        assert isinstance(out, Completion)
        return as_chat(out, name, kind)

    def create_chat_completions(
        self,
        conversations: Sequence[list[dict[str, Any]]],
        max_tokens: int | None = None,
        sampler: Samplers = None,
        stop: str | list[str] | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        response_format: dict[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> list[ChatCompletion]:
        """Reply to every conversation in shared batches (see create_completions); replies in their order."""
        if isinstance(conversations, (str, bytes)) or not isinstance(conversations, Sequence):
            raise InvalidParameterError("conversations must be a list of message lists", field="conversations")
        jobs, kinds = [], []
        for messages, (chain, own) in zip(conversations, self._samplers_for(len(conversations), sampler)):
            tokens, chain, kind = self._chat_prompt(messages, chain, tools, tool_choice, response_format,
                                                    chat_template)
            jobs.append(self._job(tokens, max_tokens, chain, stop, None, False, response_format, own))
            kinds.append(kind)
        name = self.params.model_path.name
        return [as_chat(done, name, kind) for done, kind in zip(_collect_many(self._stream(jobs), jobs), kinds)]

    def _chat_prompt(self, messages: list[dict[str, Any]], sampler: LlamaSampler | None,
                     tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None,
                     response_format: dict[str, Any] | None, chat_template: str | None
                     ) -> tuple[list[int], LlamaSampler | None, str | None]:
        """The rendered prompt, the sampler (constrained for a forced tool call) and the tool-call family."""
        if tool_choice not in (None, "auto", "none", "required") and not isinstance(tool_choice, dict):
            raise InvalidParameterError(f'tool_choice must be "auto", "none", "required" or {{"type": "function", '
                                        f'"function": {{"name": ...}}}}, got {tool_choice!r}', field="tool_choice")
        if tools is not None:
            tools = check_tools(tools)
        elif tool_choice not in (None, "auto", "none"):
            raise InvalidParameterError("tool_choice needs tools", field="tool_choice")
        use_tools = tools is not None and tool_choice != "none"
        if self._mtmd is not None and self._mtmd.has_media(messages):
            tokens, template = self._mtmd.chat_prompt(messages, lambda flat: render_prompt(
                self, check_messages(flat), chat_template, tools if use_tools else None))
        else:
            tokens, template = render(self, check_messages(messages), chat_template, tools if use_tools else None)
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


def _projector(params: LlamaParams, model: LlamaModel) -> Projector | None:
    """The projector a plugin opens for params.mmproj_path (None without one): hook llamaplug_open_projector."""
    if params.mmproj_path is None:
        return None
    projector = plugins.open_projector(params.mmproj_path, model, params)
    if projector is None:
        raise InvalidParameterError("mmproj_path needs the multimodal plugin: pip install llamaplug-mtmd",
                                    field="mmproj_path")
    return projector


def _is_media(prompt: Any) -> bool:
    return isinstance(prompt, MediaPrompt)  # what a Projector's chat_prompt made


def _stderr_is_tty() -> bool:
    import sys

    return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def _progress_bar(name: str) -> Any:
    from tqdm import tqdm

    class Bar(tqdm):
        def update_to(self, fraction: float) -> None:
            self.update(round(fraction * 100) - self.n)

    return Bar(total=100, desc=f"loading {name}", unit="%", leave=False)


def response_grammar(response_format: dict[str, Any] | None) -> Grammar | None:
    """The grammar an OpenAI-shaped response_format asks for (None: free text)."""
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


class _Sink:
    """A job's sink: its events, tagged with its index, into the caller's queue."""

    __slots__ = ("events", "index")

    def __init__(self, events: queue.SimpleQueue[Any], index: int):
        self.events, self.index = events, index

    def __call__(self, event: CompletionChunk | BaseException) -> None:
        self.events.put((self.index, event))


def _collect_many(events: Iterator[tuple[int, CompletionChunk]], jobs: list[Job]) -> list[Completion]:
    streams: list[list[CompletionChunk]] = [[] for _ in jobs]
    for i, chunk in events:
        streams[i].append(chunk)
    return [_collect(iter(chunks), job.prompt) for chunks, job in zip(streams, jobs)]


def _collect(events: Iterator[CompletionChunk], prompt: list[int]) -> Completion:
    parts: list[str] = []
    tokens: list[int] = []
    logprobs: list[TokenLogprob] = []
    want_logprobs = False
    for chunk in events:
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
