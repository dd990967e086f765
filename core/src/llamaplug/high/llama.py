"""Llama: the orchestrator that owns a model, a context and the generation loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..blocks import _native_log
from ..blocks.adapters import LoraAdapter
from ..blocks.backend import LlamaBackend
from ..blocks.context import LlamaContext
from ..blocks.grammar import Grammar
from ..blocks.model import LlamaModel
from ..blocks.sampling import LlamaSampler, SamplerChain
from ..errors import ContextOverflowError, InvalidParameterError
from ..params import LlamaParams
from .chat import ChatCompletion, ChatCompletionChunk, as_chat, as_chunks, check_messages, render
from .completion import (
    Completion,
    CompletionChunk,
    CompletionTimings,
    StopReason,
    TextAssembler,
    TokenLogprob,
)
from .embeddings import embed, rerank
from .infill import check_text, infill_tokens
from .tool_calls import check_tools, grammar_for
from .tool_calls import family as tool_family


class Llama:
    """Model + context + default sampler; `create_completion` runs the whole loop."""

    def __init__(self, params: LlamaParams, backend: LlamaBackend, model: LlamaModel, context: LlamaContext):
        self.params = params
        self.backend = backend
        self._model = model
        self._context = context
        self._cancel = threading.Event()

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
        except BaseException:
            model.close()
            raise
        return cls(params, backend, model, context)

    @property
    def model(self) -> LlamaModel:
        return self._model

    @property
    def context(self) -> LlamaContext:
        return self._context

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self._model.tokenize(text, add_bos, special)

    def detokenize(self, tokens: Any, special: bool = False) -> str:
        return self._model.detokenize(tokens, special)

    def cancel(self) -> None:
        """Stop the running generation (from any thread) before its next token: StopReason.CANCELLED."""
        self._cancel.set()

    def close(self) -> None:
        self._model.close()  # closes the context first

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
            raise InvalidParameterError(f"max_tokens must be a non-negative int or None, got {max_tokens!r}",
                                        field="max_tokens")
        if logprobs is not None and not 0 <= logprobs <= self._model.n_vocab:
            raise InvalidParameterError(f"logprobs must be in 0..n_vocab, got {logprobs}", field="logprobs")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if isinstance(prompt, str):
            tokens = self._model.tokenize(prompt, True, special)
        else:
            tokens = self._model.check_tokens(prompt).tolist()
        if not tokens:
            raise InvalidParameterError("the prompt has no tokens", field="prompt")
        n_ctx = self._context.n_ctx
        if len(tokens) >= n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(tokens)} tokens but the context holds {n_ctx} (n_ctx); "
                "shorten the prompt or raise n_ctx"
            )
        own = False
        grammar = response_grammar(response_format)
        if grammar is not None:
            if sampler is not None and not isinstance(sampler, SamplerChain):
                raise InvalidParameterError("response_format needs a SamplerChain (or no sampler)", field="sampler")
            sampler = (sampler if sampler is not None else SamplerChain().greedy()).constrained(grammar)
            own = True
        events = self._generate(tokens, max_tokens, sampler, stops, logprobs, own)
        return events if stream else _collect(events, tokens)

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
        return embed(self, texts, normalize, pooling, truncate)

    def rerank(self, query: str, documents: list[str], truncate: bool = False) -> np.ndarray:
        """Relevance scores of `documents` for `query` (a rank-pooling model: a reranker), in their order."""
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
        if tool_choice not in (None, "auto", "none", "required") and not isinstance(tool_choice, dict):
            raise InvalidParameterError(f'tool_choice must be "auto", "none", "required" or {{"type": "function", '
                                        f'"function": {{"name": ...}}}}, got {tool_choice!r}', field="tool_choice")
        if tools is not None:
            tools = check_tools(tools)
        elif tool_choice not in (None, "auto", "none"):
            raise InvalidParameterError("tool_choice needs tools", field="tool_choice")
        use_tools = tools is not None and tool_choice != "none"
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
        name = self.params.model_path.name
        out = self.create_completion(tokens, max_tokens, sampler, stop, stream, response_format=response_format)
        if stream:
            assert not isinstance(out, Completion)
            return as_chunks(out, name, kind)
        assert isinstance(out, Completion)
        return as_chat(out, name, kind)

    def _generate(self, prompt: list[int], max_tokens: int | None, sampler: LlamaSampler | None,
                  stops: list[str], n_logprobs: int | None, own: bool = False) -> Iterator[CompletionChunk]:
        ctx, model = self._context, self._model
        own_sampler = sampler is None or own
        if sampler is None:
            sampler = SamplerChain().greedy()
        elif isinstance(sampler, SamplerChain):
            sampler.select_with(self.params.seed)  # for the dist appended to a chain that selects nothing
        assert sampler is not None
        self._cancel.clear()  # a cancel stops the generation running when it is called, not a later one
        try:
            t0 = time.perf_counter()
            ctx.clear_cache()
            ctx.eval(prompt, 0)
            t1 = time.perf_counter()
            text = TextAssembler(stops)
            limit = ctx.n_ctx - len(prompt) if max_tokens is None else max_tokens
            reason = StopReason.MAX_TOKENS
            produced = 0
            for step in range(limit):
                if self._cancel.is_set():
                    reason = StopReason.CANCELLED
                    break
                token = sampler.sample(ctx, -1)
                lp = [self._logprob(token, n_logprobs)] if n_logprobs is not None else None
                if model.token_is_eog(token):
                    reason = StopReason.EOS
                    break
                produced += 1
                new = text.feed(model.token_to_piece(token))
                if text.stopped:
                    reason = StopReason.STOP_SEQUENCE
                    yield CompletionChunk(new, [token], lp)
                    break
                last = step == limit - 1
                if not last:
                    if ctx.n_past >= ctx.n_ctx:
                        reason = StopReason.CONTEXT_FULL
                        yield CompletionChunk(new, [token], lp)
                        break
                    ctx.decode_single(token)
                yield CompletionChunk(new, [token], lp)
            else:
                if max_tokens is None:
                    reason = StopReason.CONTEXT_FULL
            t2 = time.perf_counter()
            timings = CompletionTimings(len(prompt), (t1 - t0) * 1e3, produced, (t2 - t1) * 1e3)
            yield CompletionChunk(text.finish(), [], None, reason, timings)
        finally:
            if own_sampler:
                sampler.close()

    def _logprob(self, token: int, n: int) -> TokenLogprob:
        # The logits row is a view. The vocabulary is copied once per token, into a scratch row kept
        # for the next token: exp(logits - max) in place, whose order is the logits' order for the
        # top n. Never a Python loop over the vocabulary.
        logits = self._context.get_logits_ith(-1)
        scratch = getattr(self, "_scratch", None)
        if scratch is None or scratch.size != logits.size:
            scratch = self._scratch = np.empty(logits.size, dtype=np.float32)
        top = float(logits.max())
        np.subtract(logits, top, out=scratch)
        np.exp(scratch, out=scratch)
        logz = top + float(np.log(scratch.sum(dtype=np.float64)))
        best: tuple[tuple[int, float], ...] = ()
        if n:
            idx = np.argpartition(scratch, -n)[-n:] if n < logits.size else np.arange(logits.size)
            idx = idx[np.argsort(-logits[idx], kind="stable")]
            best = tuple((int(i), float(logits[i]) - logz) for i in idx)
        return TokenLogprob(token, self._model.token_to_str(token), float(logits[token]) - logz, best)


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
