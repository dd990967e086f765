"""Llama: the orchestrator that owns a model, a context and the generation loop."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from typing_extensions import Unpack

from .. import plugins
from ..blocks import _native_log
from ..blocks.adapters import LoraAdapter
from ..blocks.backend import LlamaBackend
from ..blocks.context import LlamaContext
from ..blocks.model import LlamaModel
from ..blocks.sampling import LlamaSampler
from ..errors import InvalidParameterError
from ..params import LlamaParams, SamplerParams
from ..plugin_api import Projector
from . import events, saved_state
from .chat import ChatCompletion, ChatCompletionChunk, ChatSpec
from .chat_call import ChatCall, chat_results, start_chat
from .completion import Completion, CompletionChunk
from .disk_store import open_disk_store
from .embeddings import embed, rerank
from .engine import Engine
from .infill import check_text, infill_tokens
from .jobs import Samplers, collect, collect_many, completion_job, completion_jobs, samplers_for
from .jobs import response_grammar as response_grammar  # its home was here
from .ngram_mod import NgramModDrafter
from .sampling_options import SamplingOptions, call_sampler, calls_samplers
from .speculative import Drafter, ModelDrafter, NgramDrafter, check_vocab, synth_rates
from .structured import ResponseFormat, with_parsed
from .tool_schema import ToolSpec


class Llama:
    """Model + context + the engine that runs every generation on them.

    Generations from any number of threads share the engine's batches: with
    n_seq_max=N, N sequences decode together (continuous batching, engine.py);
    more wait for a free slot. `create_completions` runs many prompts at once.
    """

    def __init__(self, params: LlamaParams, backend: LlamaBackend, model: LlamaModel, context: LlamaContext,
                 drafter: Drafter | None = None):
        self.params = params
        self.backend = backend
        self._model = model
        self._context = context
        self._engine = Engine(context, params.cache_ram_mib << 20, drafter,
                              disk=open_disk_store(params.cache_dir, params.cache_disk_mib, context),
                              align=context.n_ubatch if params.cache_exact else 1,
                              synth_rates=_synth_rates(params, drafter), context_shift=params.context_shift)
        self._embed_lock = threading.Lock()  # the embedding contexts are not the engine's
        self._projector: Projector | None = None  # a plugin's, when LlamaParams.mmproj_path is set (llamaplug-mtmd)

    @classmethod
    def load(cls, params: LlamaParams | str | os.PathLike[str], **options: Any) -> Llama:
        """Load a model: `Llama.load("model.gguf", n_ctx=1024, n_threads=4)`, or from a LlamaParams
        (`options` then change it); `options` are LlamaParams fields."""
        if not isinstance(params, LlamaParams):
            params = LlamaParams(model_path=params, **options)
        elif options:
            params = params.replace(**options)
        _native_log.set_level(params.log_level)
        bar = None
        if params.progress_callback is None and (params.progress or (params.progress is None and _stderr_is_tty())):
            bar = _progress_bar(params.model_path.name)
            params = params.replace(progress_callback=bar.update_to)
        backend = LlamaBackend.init(params.backends)
        for endpoint in params.rpc_servers:
            backend.add_rpc_server(endpoint)
        backend.check_rpc_servers()  # a registered server that is gone aborts the load in ggml-rpc: an error here
        model = LlamaModel(params.model_path, params.model_params(), params.context_params())
        # The fit sized the context that n_ctx=0 left to it (as llama-cli does).
        context_params = model.fit.context if model.fit is not None else params.context_params()
        if params.cache_dir is not None and params.cache_disk_mib > 0 and model.n_swa and not context_params.swa_full:
            # A sliding-window cache keeps only the last n_swa + n_ubatch positions of a read prompt, so a stored
            # sequence that a later prompt leaves before its end (another question after the same system prompt)
            # lacks the window that prompt needs, and the slot reads it all again: a disk tier would never serve.
            logging.getLogger("llamaplug.cache").info("cache_dir on a sliding-window model: swa_full on")
            context_params = context_params.replace(swa_full=True)
        if bar is not None:
            bar.close()
        try:
            context = LlamaContext(model, context_params)
            for path, scale in params.lora:
                context.set_lora(LoraAdapter.load(model, path), scale)
            drafter = _open_drafter(params, model, context)
            try:
                _synth_rates(params, drafter)  # a bad setting is said before the Llama is made
            except BaseException:
                if drafter is not None:
                    drafter.close()
                raise
        except BaseException:
            model.close()
            raise
        llama = cls(params, backend, model, context, drafter)
        if params.mmproj_path is not None:
            try:  # opening it encodes once (its warm-up): on the engine's thread, as every compute (engine.py)
                llama._projector = llama._engine.call(lambda: _open_projector(params, model))
            except BaseException:
                llama.close()
                raise
        return llama

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, revision: str | None = None,
                        cache_dir: str | os.PathLike[str] | None = None, **params: Any) -> Llama:
        """Load a GGUF of a Hugging Face Hub repository (pip install "llamaplug[hub]"): `filename` is a glob
        ("*Q4_K_M.gguf"), `repo_id` may end in ":TAG" as llama.cpp's -hf; `params` are LlamaParams fields.
        Downloads go to huggingface_hub's cache (HF_HUB_OFFLINE=1: the cache only); see high/hub.py."""
        from . import hub

        tag = None
        ref = hub.parse_ref(repo_id)
        if ref is not None and ref[1] is not None:
            repo_id, tag = ref
        path = hub.download(repo_id, filename, tag=tag, revision=revision, cache_dir=cache_dir)
        return cls.load(LlamaParams(model_path=path, **params))

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

    @property
    def projector(self) -> Projector | None:
        """The media projector a plugin opened for LlamaParams.mmproj_path (None without one)."""
        return self._projector

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

    def warm_up(self) -> None:
        """Run one decode now and forget it (as llama-server before it says ready), so that the first request
        does not pay the first decode's costs: the weights paged in, the backends' first-use work. On the
        engine's thread, as every decode of this Llama's (engine.py)."""
        self._engine.call(self._warm_up)

    def _warm_up(self) -> None:
        with self._engine.idle("warm_up") as slots:
            for mine in slots:
                mine.clear()  # the warm-up empties the cache
            self._context.warm_up()
        if isinstance(self._engine.drafter, ModelDrafter):
            self._engine.drafter.context.warm_up()

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
        sampler: LlamaSampler | SamplerParams | str | None = None,
        stop: str | list[str] | None = None,
        stream: bool = False,
        logprobs: int | None = None,
        special: bool = False,
        response_format: ResponseFormat | None = None,
        structured_engine: str | None = None,
        **sampling: Unpack[SamplingOptions],
    ) -> Completion | Iterator[CompletionChunk]:
        """Complete `prompt` (text, or token ids).

        max_tokens=None generates until EOS or a full context. The default
        sampler is greedy; sampling keywords (temperature=0.7, top_p, top_k,
        min_p, seed, repeat_penalty, presence_penalty, frequency_penalty,
        logit_bias, any SamplerParams field: sampling_options.py) sample with
        the chain SamplerParams builds from them, as `sampler=SamplerParams(...)`
        does; `sampler="greedy"` is the default spelt out. A SamplerChain that
        ends without a selecting sampler gets dist(LlamaParams.seed) appended
        (unless it was given its own seed). `special=True` parses control-token text in the prompt. With
        stream=True, returns an iterator of CompletionChunk whose texts join to
        the non-streamed text. `response_format` (OpenAI's shapes:
        {"type": "json_object"} for any JSON object, {"type": "json_object",
        "schema": {...}} or {"type": "json_schema", "json_schema": {"schema":
        {...}}}) puts the schema's grammar in front of the sampler chain; a
        pydantic model as response_format also gives the validated object as
        Completion.parsed (not when streamed). `structured_engine` ("gbnf", "llguidance", "auto"; None:
        LlamaParams.structured_engine) is what turns the schema into a constraint (structured.py).
        """
        chain, own = call_sampler(self, sampler, sampling, "create_completion")
        job = completion_job(self, prompt, max_tokens, chain, stop, logprobs, special, response_format, own,
                             structured_engine)
        if stream:
            return events.chunks(self._engine, job)
        return with_parsed(collect(events.gather_chunks(self._engine, job), job.prompt), response_format)

    def create_completions(
        self,
        prompts: Sequence[str | list[int]],
        max_tokens: int | None = 16,
        sampler: Samplers = None,
        stop: str | list[str] | None = None,
        stream: bool = False,
        logprobs: int | None = None,
        special: bool = False,
        response_format: ResponseFormat | None = None,
        **sampling: Unpack[SamplingOptions],
    ) -> list[Completion] | Iterator[tuple[int, CompletionChunk]]:
        """Complete every prompt, n_seq_max at a time in shared batches; results in the prompts' order.

        `sampler`: None (greedy), a SamplerParams (one chain each), a callable returning a
        fresh sampler, or a list with one sampler per prompt (a sampler has state, so one
        object cannot serve two prompts), or "greedy"; or sampling keywords, as create_completion
        (one chain each). With stream=True, yields (index, chunk) as they come.
        """
        sampler = calls_samplers(self, sampler, sampling, "create_completions")
        jobs = completion_jobs(self, prompts, max_tokens, sampler, stop, logprobs, special, response_format)
        if stream:
            return events.stream(self._engine, jobs)
        return [with_parsed(done, response_format) for done in collect_many(events.gather(self._engine, jobs), jobs)]

    def create_infill(self, prefix: str, suffix: str, max_tokens: int | None = 64,
                      sampler: LlamaSampler | SamplerParams | str | None = None,
                      stop: str | list[str] | None = None, stream: bool = False,
                      extra: list[dict[str, str]] | None = None, spm: bool = False,
                      **sampling: Unpack[SamplingOptions]) -> Completion | Iterator[CompletionChunk]:
        """The text between `prefix` and `suffix`, from the model's FIM tokens (see infill.py for the layout).

        `extra` chunks ({"filename", "text"}) go before, as repository context. Generation ends
        at an end-of-generation token (FIM models end the middle with one) or max_tokens.
        """
        tokens = infill_tokens(self._model, check_text(prefix, "prefix"), check_text(suffix, "suffix"), extra, spm)
        return self.create_completion(tokens, max_tokens, sampler, stop, stream, **sampling)

    def embed(self, texts: list[str] | list[str | list[int]], normalize: bool = True, pooling: str | None = None,
              truncate: bool = False) -> np.ndarray | list[np.ndarray]:
        """Embeddings of `texts`: an (n, n_embd) array, or with pooling="none" one (tokens, n_embd) array each.

        `pooling` is "mean", "cls", "last" or "none" (default: the model's own where its GGUF
        names one, as llama-embedding, else "mean": the same vectors as the server's
        /v1/embeddings, embeddings.default_pooling). Many texts go into each llama_decode. normalize=True divides
        by the L2 norm. A text longer than the embedding context is a ContextOverflowError
        naming its index, or cut to fit with truncate=True. An item may be token ids instead of text (taken as
        they are: no BOS or separator is added).
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
        sampler: LlamaSampler | SamplerParams | str | None = None,
        stop: str | list[str] | None = None,
        stream: bool = False,
        tools: list[ToolSpec] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        response_format: ResponseFormat | None = None,
        chat_template: str | None = None,
        reasoning_format: str | None = None,
        reasoning_effort: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        reasoning_budget_tokens: int | None = None,
        reasoning_budget_message: str | None = None,
        structured_engine: str | None = None,
        **sampling: Unpack[SamplingOptions],
    ) -> ChatCompletion | Iterator[ChatCompletionChunk]:
        """Reply to `messages` (OpenAI's shape) through the model's own chat template.

        The prompt, the tool-call grammar and the reading of the reply are llama.cpp's own chat
        layer's (common/chat.h, as llama-server): every template it knows. `chat_template`
        overrides the GGUF's (a Jinja template, or a name llama.cpp knows: chat_builtin.builtin_names());
        a GGUF without one uses llama.cpp's chatml. `tools` go to the template and calls in the reply
        come back as message.tool_calls; tool_choice "required" or a named function is enforced by
        a grammar, "auto" by a lazy one (from the template's call marker on). The model's thinking
        comes back in message.reasoning_content (`reasoning_format="none"` keeps it in content);
        `chat_template_kwargs` (e.g. {"enable_thinking": False}) and `reasoning_effort` go to the
        template. `reasoning_budget_tokens` caps the thinking as llama-server's field does: after that many
        tokens `reasoning_budget_message` and the template's end-of-thinking tag are forced (0: no thinking).
        A tool may be a Python function: its JSON schema comes from its signature and docstring
        (tool_schema.function_tool). Streamed, calls come
        as delta.tool_calls (see chat.ChatStream). `response_format` may be a pydantic model:
        the reply is constrained to its JSON schema and message.parsed is the validated object
        (ReplyValidationError names the field that does not fit; not when streamed).
        max_tokens=None generates until the end of the turn. Sampling keywords (temperature=0.7,
        seed=1, ...) and `sampler` as create_completion. `structured_engine` as create_completion's: for
        response_format (tool calls keep the chat layer's GBNF grammar).
        """
        chain, own = call_sampler(self, sampler, sampling, "create_chat_completion")
        spec = ChatSpec(messages, tools=tools, tool_choice=tool_choice, response_format=response_format,
                        chat_template=chat_template, reasoning_format=reasoning_format,
                        reasoning_effort=reasoning_effort, chat_template_kwargs=chat_template_kwargs,
                        parallel_tool_calls=parallel_tool_calls, reasoning_budget_tokens=reasoning_budget_tokens,
                        reasoning_budget_message=reasoning_budget_message, structured_engine=structured_engine)
        run = start_chat(self, ChatCall(spec, chain, own, max_tokens, stop))
        return run.stream() if stream else run.result()

    def create_chat_completions(
        self,
        conversations: Sequence[list[dict[str, Any]]],
        max_tokens: int | None = None,
        sampler: Samplers = None,
        stop: str | list[str] | None = None,
        tools: list[ToolSpec] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        response_format: ResponseFormat | None = None,
        chat_template: str | None = None,
        **sampling: Unpack[SamplingOptions],
    ) -> list[ChatCompletion]:
        """Reply to every conversation in shared batches (see create_completions); replies in their order."""
        if isinstance(conversations, (str, bytes)) or not isinstance(conversations, Sequence):
            raise InvalidParameterError("conversations must be a list of message lists", field="conversations")
        sampler = calls_samplers(self, sampler, sampling, "create_chat_completions")
        runs = [start_chat(self, ChatCall(ChatSpec(messages, tools=tools, tool_choice=tool_choice,
                                                   response_format=response_format, chat_template=chat_template),
                                          chain, own, max_tokens, stop))
                for messages, (chain, own) in zip(conversations, samplers_for(self, len(conversations), sampler))]
        return chat_results(runs)


def _open_projector(params: LlamaParams, model: LlamaModel) -> Projector | None:
    """The projector a plugin opens for params.mmproj_path (None without one): hook llamaplug_open_projector."""
    if params.mmproj_path is None:
        return None
    projector = plugins.open_projector(params.mmproj_path, model, params)
    if projector is None:
        raise InvalidParameterError("mmproj_path needs the multimodal plugin: pip install llamaplug-mtmd",
                                    field="mmproj_path")
    return projector


def _open_drafter(params: LlamaParams, model: LlamaModel, context: LlamaContext) -> Drafter | None:
    """The drafter of speculative decoding that params ask for (None: none)."""
    if params.speculative in (None, "none") and params.draft_model_path is None:
        return None
    if params.speculative == "auto" and context.recurrent:
        logging.getLogger("llamaplug.speculative").info(
            'speculative="auto": %s is a recurrent model, whose cache cannot be cut back after a wrong guess; '
            "no drafting", params.model_path.name)
        return None
    if context.recurrent:
        raise InvalidParameterError(f"speculative decoding needs a cache that can be cut back after a wrong guess; "
                                    f"{params.model_path.name} is a recurrent model",
                                    field="speculative" if params.speculative else "draft_model_path")
    if params.speculative in ("ngram", "ngram-simple"):
        return NgramDrafter(params.ngram_size, params.draft_max)
    if params.speculative in ("auto", "ngram-mod"):
        return NgramModDrafter(params.ngram_mod_n_match, params.ngram_mod_n_min, params.ngram_mod_n_max,
                               adaptive=params.speculative == "auto")
    assert params.draft_model_path is not None
    # The target's context shape: one draft sequence per slot, as long as the slot's.
    shape = context.params.replace(n_ctx=context.n_ctx, embeddings=False)
    draft = LlamaModel(params.draft_model_path, params.model_params().replace(progress_callback=None, tokenizer=None),
                       shape)
    try:
        check_vocab(model, draft)
        draft_context = LlamaContext(draft, draft.fit.context if draft.fit is not None else shape)
        if draft_context.recurrent:
            raise InvalidParameterError(f"the draft model {params.draft_model_path.name} is recurrent: its cache "
                                        "cannot be cut back after a wrong guess", field="draft_model_path")
    except BaseException:
        draft.close()
        raise
    return ModelDrafter(draft_context, params.draft_max, params.draft_min, params.draft_p_min)


def _synth_rates(params: LlamaParams, drafter: Drafter | None) -> list[float] | None:
    """The per-position rates of synthetic draft acceptance that params ask for (benchmarking only), checked
    against the drafter's most guesses per step as llama-server's (None: none)."""
    return synth_rates(params.draft_synth_rates, params.draft_synth_len, drafter.draft_max if drafter else 0) or None


def _stderr_is_tty() -> bool:
    import sys

    return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def _progress_bar(name: str) -> Any:
    from tqdm import tqdm

    class Bar(tqdm):
        def update_to(self, fraction: float) -> None:
            self.update(round(fraction * 100) - self.n)

    return Bar(total=100, desc=f"loading {name}", unit="%", leave=False)
