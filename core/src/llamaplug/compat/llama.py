"""llama-cpp-python's `Llama` on llamaplug's engine: its constructor, methods and result dicts.

Every generation is a job of the llamaplug `Llama` underneath (`.llamaplug`), so it shares that
engine's batches, prefix reuse and backends; sampling is the chain llama-cpp-python would build
(settings.py), logits processors and stopping criteria run in a Python stage of that chain
(processors.py), and results are llama-cpp-python's dicts (responses.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np

import llamaplug as lp
from llamaplug import InvalidParameterError, NumaStrategy, SamplerChain
from llamaplug.blocks.chat_builtin import builtin_names
from llamaplug.high import events, hub
from llamaplug.high.chat import OWN_TEMPLATES, ChatSpec
from llamaplug.high.chat_call import ChatCall, start_chat
from llamaplug.high.completion import TextAssembler
from llamaplug.high.engine import Job
from llamaplug.high.infill import check_text, infill_tokens
from llamaplug.high.jobs import completion_job, response_grammar

from . import responses, settings
from .grammar import LlamaGrammar
from .processors import LogitsProcessorList, Stage, StoppingCriteriaList
from .state import LlamaState
from .tokenizer import LlamaTokenizer

# llama-cpp-python's chat_format names and the llama.cpp built-in template of the same format.
CHAT_FORMATS = {
    "llama-2": "llama2", "llama-3": "llama3", "chatml": "chatml", "qwen": "chatml", "mistral-instruct": "mistral-v1",
    "zephyr": "zephyr", "vicuna": "vicuna", "openchat": "openchat", "chatglm3": "chatglm3", "gemma": "gemma",
    "saiga": "llama2",
    # llama-cpp-python's format for tools on a ChatML model: llamaplug's ChatML with Hermes-style tools
    "chatml-function-calling": "chatml-tools",
}
DEFAULT_CHAT = "chat_template.default"  # the GGUF's own template


class Llama:
    """llama-cpp-python's high-level `Llama`, running on a llamaplug `Llama` (see docs/from-llama-cpp-python.md)."""

    def __init__(self, model_path: str | os.PathLike[str], *, seed: int = settings.LLAMA_DEFAULT_SEED,
                 chat_format: str | None = None, numa: bool | int = False, verbose: bool = True,
                 pooling_type: int = -1, spm_infill: bool = False, last_n_tokens_size: int = 64, **kwargs: Any):
        params = settings.llama_params(model_path, dict(kwargs, seed=seed, verbose=verbose, pooling_type=pooling_type))
        _check_chat_format(chat_format)
        if numa:
            lp.LlamaBackend.init_numa(NumaStrategy.DISTRIBUTE if numa is True else NumaStrategy(numa))
        self.model_path = str(model_path)
        self.verbose = verbose
        self.spm_infill = spm_infill
        self.last_n_tokens_size = last_n_tokens_size
        self.cache: Any = None
        self._seed = seed or settings.LLAMA_DEFAULT_SEED
        self._ids: list[int] = []  # the prompt and reply of the last generation (input_ids)
        self.llamaplug = lp.Llama.load(params)
        try:
            self.chat_format, self._template = _chat_format(chat_format, self.llamaplug.model)
        except BaseException:
            self.llamaplug.close()
            raise
        self.params = params
        self.n_batch = params.n_batch
        self.metadata: dict[str, str] = dict(self.llamaplug.model.metadata)
        # -1: the model's own as llama.cpp resolves it, as llama-cpp-python's (a chat model's: none, a vector per
        # token), not llamaplug's embed default (mean where the GGUF names none)
        self._pooling = int(params.pooling_type)
        self.tokenizer_ = LlamaTokenizer(self)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, additional_files: list[str] | None = None,
                        local_dir: str | os.PathLike[str] | None = None, local_dir_use_symlinks: Any = "auto",
                        cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Llama:
        """A GGUF of a Hugging Face Hub repository (`filename` a glob; the parts of a split GGUF come with it),
        through huggingface_hub's cache (pip install "llamaplug[hub]")."""
        if local_dir is not None:
            raise InvalidParameterError("local_dir is not supported: models go to huggingface_hub's cache "
                                        "(cache_dir= chooses it)", field="local_dir")
        path = hub.download(repo_id, filename, cache_dir=cache_dir)
        return cls(model_path=path, **kwargs)

    # -- the model -------------------------------------------------------------
    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.llamaplug.tokenize(_text(text, "text"), add_bos, special)

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False) -> bytes:
        """The bytes of `tokens`; after `prev_tokens`, the bytes they add to those (a leading space kept or not
        as the tokenizer decides in context)."""
        model = self.llamaplug.model
        if not prev_tokens:
            return model.detokenize_bytes(list(tokens), special)
        before = model.detokenize_bytes(list(prev_tokens), special)
        return model.detokenize_bytes(list(prev_tokens) + list(tokens), special)[len(before):]

    def n_ctx(self) -> int:
        return self.llamaplug.context.n_ctx

    def tokenizer(self) -> LlamaTokenizer:
        return LlamaTokenizer(self)

    @property
    def model(self) -> lp.LlamaModel:
        """The loaded model (llama-cpp-python's is its llama_model pointer): what llama_model_get_vocab takes."""
        return self.llamaplug.model

    @property
    def context_params(self) -> SimpleNamespace:
        """The context's settings under llama-cpp-python's names (its ctypes llama_context_params), read-only here:
        LlamaIndex's LlamaCPP reads `context_params.n_ctx` for its context window."""
        p = self.params
        return SimpleNamespace(n_ctx=self.n_ctx(), n_batch=p.n_batch, n_ubatch=p.n_ubatch, n_seq_max=p.n_seq_max,
                               n_threads=p.n_threads, n_threads_batch=p.n_threads_batch or p.n_threads)

    def n_embd(self) -> int:
        return self.llamaplug.model.n_embd

    def n_vocab(self) -> int:
        return self.llamaplug.model.n_vocab

    def token_eos(self) -> int:
        return _or_minus_one(self.llamaplug.model.eos)

    def token_bos(self) -> int:
        return _or_minus_one(self.llamaplug.model.bos)

    def token_nl(self) -> int:
        return _or_minus_one(self.llamaplug.model.nl)

    def pooling_type(self) -> int:
        if self._pooling >= 0:
            return self._pooling
        meta = self.metadata
        return int(meta.get(f"{meta.get('general.architecture', '')}.pooling_type", 0))

    @property
    def input_ids(self) -> np.ndarray:
        return np.asarray(self._ids, dtype=np.intc)

    @property
    def n_tokens(self) -> int:
        return len(self._ids)

    # -- state -----------------------------------------------------------------
    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def set_cache(self, cache: Any) -> None:
        """Kept for callers; llamaplug's engine reuses cached prefixes by itself (LlamaParams.cache_ram_mib)."""
        self.cache = cache

    def reset(self) -> None:
        self._ids = []

    def save_state(self) -> LlamaState:
        data = self.llamaplug.save_state()
        assert isinstance(data, bytes)
        return LlamaState(self.input_ids, np.zeros((0, self.n_vocab()), np.float32), len(self._ids), data, len(data),
                          self._seed)

    def load_state(self, state: LlamaState) -> None:
        if not isinstance(state, LlamaState):
            raise InvalidParameterError(f"load_state takes what save_state returned, got {type(state).__name__}",
                                        field="state")
        self.llamaplug.load_state(state.llama_state)
        self._seed = state.seed
        self._ids = [int(t) for t in np.asarray(state.input_ids)[: state.n_tokens]]

    def close(self) -> None:
        self.llamaplug.close()

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- completions -----------------------------------------------------------
    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
                          logprobs: int | None = None, echo: bool = False, stop: str | list[str] | None = None,
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_penalty: float = 1.0,
                          top_k: int = 40, stream: bool = False, seed: int | None = None, tfs_z: float = 1.0,
                          mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                          model: str | None = None, stopping_criteria: StoppingCriteriaList | None = None,
                          logits_processor: LogitsProcessorList | None = None, grammar: LlamaGrammar | None = None,
                          logit_bias: dict[int, float] | None = None) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama-cpp-python's completion: a `text_completion` dict, or with stream=True an iterator of them.

        max_tokens None or <= 0 generates until the end of the context. The prompt's text may hold
        control tokens (parsed as special, as llama-cpp-python does).
        """
        if echo and logprobs is not None:
            raise InvalidParameterError("echo with logprobs needs the prompt's logprobs, which llamaplug does not "
                                        "compute: leave one of them out", field="logprobs")
        stage = Stage(logits_processor, stopping_criteria) if logits_processor or stopping_criteria else None
        chain = self._chain(seed, grammar.grammar if isinstance(grammar, LlamaGrammar) else _grammar(grammar),
                            logit_bias, stage, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            typical_p=typical_p, repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                            presence_penalty=presence_penalty, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                            mirostat_eta=mirostat_eta)
        tokens = self._prompt(prompt, suffix)
        own_text = stage is not None and bool(stage.criteria)
        job = completion_job(self.llamaplug, tokens, _limit(max_tokens), chain, None if own_text else stop, logprobs,
                             own_sampler=True)
        if stage is not None:
            stage.start(job.prompt)
            stage.on_stop = job.cancel
        name = model if model is not None else self.model_path
        pieces = self._pieces(job, stage, _stops(stop) if own_text else None, stream)
        lp_text = responses.Logprobs(self.llamaplug.model, len(prompt) if isinstance(prompt, str) else 0)
        if stream:
            return self._completion_stream(pieces, job, name, lp_text if logprobs is not None else None)
        return self._completion(pieces, job, name, prompt if echo else None,
                                lp_text if logprobs is not None else None)

    __call__ = create_completion

    def _completion(self, pieces: Iterator[tuple[str, list[int], Any, str | None]], job: Job, name: str,
                    echo: str | list[int] | None, lp_text: responses.Logprobs | None) -> dict[str, Any]:
        ident, created = responses.completion_id()
        texts, tokens, finish = [], [], "length"
        for text, toks, lps, end in pieces:
            texts.append(text)
            tokens += toks
            if lp_text is not None and lps:
                lp_text.add(lps)
            if end is not None:
                finish = end
        self._ids = job.prompt + tokens
        text = "".join(texts)
        if echo is not None:
            text = (echo if isinstance(echo, str) else self.llamaplug.detokenize(echo)) + text
        return responses.completion(ident, created, name, text, lp_text.as_dict() if lp_text else None, finish,
                                    len(job.prompt), len(tokens))

    def _completion_stream(self, pieces: Iterator[tuple[str, list[int], Any, str | None]], job: Job, name: str,
                           lp_text: responses.Logprobs | None) -> Iterator[dict[str, Any]]:
        ident, created = responses.completion_id()
        tokens: list[int] = []
        for text, toks, lps, end in pieces:
            tokens += toks
            if text or (lps and lp_text is not None):
                part = lp_text.add(lps) if lp_text is not None and lps else None
                yield responses.completion_chunk(ident, created, name, text, part, None)
            if end is not None:
                self._ids = job.prompt + tokens
                yield responses.completion_chunk(ident, created, name, "", None, end)

    def _pieces(self, job: Job, stage: Stage | None, stops: list[str] | None, stream: bool
                ) -> Iterator[tuple[str, list[int], Any, str | None]]:
        """(text, tokens, logprobs, finish_reason or None) of `job` as it runs.

        With stopping criteria the text is assembled here, not by the engine, so that the token a
        criterion came too late for (the engine samples ahead) is dropped with its text.
        """
        engine = self.llamaplug.engine
        if stage is None or not stage.criteria:
            source = events.chunks(engine, job) if stream else iter(events.gather_chunks(engine, job))
            for c in source:
                yield c.text, c.tokens, c.logprobs, None if c.stop_reason is None else responses.finish_reason(
                    c.stop_reason)
            return
        text = TextAssembler(stops or [])
        model = self.llamaplug.model
        chunks = events.chunks(engine, job)
        made = 0
        try:
            for c in chunks:
                for i, token in enumerate(c.tokens):
                    if stage.stopped_at is not None and made >= stage.stopped_at:
                        yield text.finish(), [], None, "stop"
                        return
                    made += 1
                    piece = text.feed(model.token_to_piece(token))
                    lps = c.logprobs[i:i + 1] if c.logprobs else None
                    if text.stopped:
                        yield piece, [token], lps, "stop"
                        return
                    yield piece, [token], lps, None
                if c.stop_reason is not None:
                    end = "stop" if stage.stopped_at is not None else responses.finish_reason(c.stop_reason)
                    yield text.finish(), [], None, end
                    return
        finally:
            chunks.close()  # cancels the job if it is still running

    # -- chat ------------------------------------------------------------------
    def create_chat_completion(self, messages: list[dict[str, Any]], functions: list[dict[str, Any]] | None = None,
                               function_call: str | dict[str, Any] | None = None,
                               tools: list[dict[str, Any]] | None = None, tool_choice: Any = None,
                               temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                               typical_p: float = 1.0, stream: bool = False, stop: str | list[str] | None = None,
                               seed: int | None = None, response_format: dict[str, Any] | None = None,
                               max_tokens: int | None = None, presence_penalty: float = 0.0,
                               frequency_penalty: float = 0.0, repeat_penalty: float = 1.0, tfs_z: float = 1.0,
                               mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                               model: str | None = None, logits_processor: LogitsProcessorList | None = None,
                               grammar: LlamaGrammar | None = None, logit_bias: dict[int, float] | None = None,
                               logprobs: bool | None = None, top_logprobs: int | None = None
                               ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama-cpp-python's chat completion through the chat format's template: a `chat.completion` dict, or
        with stream=True an iterator of `chat.completion.chunk` dicts. Tool calls come back as message.tool_calls.
        """
        if logprobs:
            raise InvalidParameterError("logprobs in chat completions are not supported by llamaplug.compat "
                                        "(create_completion has them)", field="logprobs")
        if functions is not None and tools is None:
            tools = [{"type": "function", "function": f} for f in functions]
        if function_call is not None and tool_choice is None:
            tool_choice = function_call if isinstance(function_call, str) else \
                {"type": "function", "function": {"name": function_call.get("name")}}
        g = grammar.grammar if isinstance(grammar, LlamaGrammar) else _grammar(grammar)
        wanted = response_grammar(response_format)
        if wanted is not None:
            g = wanted  # as llama-cpp-python: a response_format's grammar replaces `grammar`
        stage = Stage(logits_processor, None) if logits_processor else None
        chain = self._chain(seed, g, logit_bias, stage, temperature=temperature, top_k=top_k, top_p=top_p,
                            min_p=min_p, typical_p=typical_p, repeat_penalty=repeat_penalty,
                            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                            mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta)
        name = model if model is not None else self.model_path
        spec = ChatSpec(messages, tools=tools, tool_choice=tool_choice, chat_template=self._template)
        run = start_chat(self.llamaplug, ChatCall(spec, chain, True, _limit(max_tokens), stop or None, model=name))
        job = run.job
        if stage is not None:
            stage.start(job.prompt)
        if stream:
            return self._chat_stream(run.stream(), job, name)
        done = run.completion()
        self._ids = job.prompt + done.tokens
        return responses.chat(run.reply(done), name)

    def _chat_stream(self, chunks: Iterator[lp.ChatCompletionChunk], job: Job, name: str
                     ) -> Iterator[dict[str, Any]]:
        for chunk in chunks:
            yield responses.chat_chunk(chunk, name)
        self._ids = list(job.prompt)

    def create_chat_completion_openai_v1(self, *args: Any, **kwargs: Any) -> Any:
        """create_chat_completion with the openai package's types (pip install openai)."""
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        if kwargs.get("stream", False):
            return (ChatCompletionChunk(**chunk) for chunk in self.create_chat_completion(*args, **kwargs))
        return ChatCompletion(**self.create_chat_completion(*args, **kwargs))  # type: ignore[arg-type]

    # -- embeddings ------------------------------------------------------------
    def embed(self, input: str | list[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False) -> Any:
        """The embedding of a text (a list of floats; with a model that does not pool, one list per token), or
        a list of them for a list of texts. return_count=True adds the number of tokens read."""
        texts = [input] if isinstance(input, str) else input
        pooling = lp.PoolingType(self._pooling).name.lower()
        vectors = self.llamaplug.embed(texts, normalize=normalize, pooling=pooling, truncate=truncate)
        data = [v.tolist() for v in vectors]
        out = data[0] if isinstance(input, str) else data
        if not return_count:
            return out
        model = self.llamaplug.model
        return out, sum(len(model.tokenize(t, True, False)) for t in texts)

    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:
        texts = input if isinstance(input, list) else [input]
        vectors, count = self.embed(texts, return_count=True)
        return {
            "object": "list",
            "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
            "model": model if model is not None else self.model_path,
            "usage": {"prompt_tokens": count, "total_tokens": count},
        }

    # -- helpers ---------------------------------------------------------------
    @staticmethod
    def logits_to_logprobs(logits: Any, axis: int = -1) -> np.ndarray:
        """log-softmax of `logits` along `axis` (float32)."""
        values = np.asarray(logits, dtype=np.float32)
        top = np.max(values, axis=axis, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        shifted = values - top
        with np.errstate(divide="ignore"):
            return (shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))).astype(np.float32)

    @staticmethod
    def longest_token_prefix(a: list[int], b: list[int]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    def _chain(self, seed: int | None, grammar: lp.Grammar | None, logit_bias: dict[int, float] | None,
               stage: Stage | None, **sampling: Any) -> SamplerChain:
        # As llama-cpp-python: a given seed becomes the Llama's; without one the next is drawn from it.
        self._seed = seed if seed is not None else settings.next_seed(self._seed)
        return settings.sampler_chain(settings.seed_of(self._seed), grammar=grammar, logit_bias=logit_bias,
                                      first=stage, penalty_last_n=self.last_n_tokens_size, **sampling)

    def _prompt(self, prompt: Any, suffix: str | None) -> list[int]:
        model = self.llamaplug.model
        if suffix is not None:
            return infill_tokens(model, check_text(prompt, "prompt"), check_text(suffix, "suffix"), None,
                                 self.spm_infill)
        if isinstance(prompt, str):
            return model.tokenize(prompt, True, special=True)
        if isinstance(prompt, (bytes, bytearray)):
            return model.tokenize(_text(prompt, "prompt"), True, special=True)
        if isinstance(prompt, (list, tuple, np.ndarray)):
            return [int(t) for t in model.check_tokens(prompt)]
        raise InvalidParameterError(f"prompt must be text or a list of token ids, got {type(prompt).__name__}",
                                    field="prompt")


def _chat_format(name: str | None, model: lp.LlamaModel) -> tuple[str, str | None]:
    """(the chat_format attribute, the template llamaplug renders with: None for the GGUF's own)."""
    if name is None:
        return (DEFAULT_CHAT, None) if model.chat_template else ("llama-2", CHAT_FORMATS["llama-2"])
    if name == DEFAULT_CHAT:
        if not model.chat_template:
            raise InvalidParameterError(f"{model.path.name} has no chat template (tokenizer.chat_template)",
                                        field="chat_format")
        return name, None
    if name.startswith("chat_template."):  # a named template of the GGUF (tokenizer.chat_template.NAME)
        source = model.named_chat_template(name[len("chat_template."):])
        if source is None:
            raise InvalidParameterError(f"{model.path.name} has no chat template {name!r}", field="chat_format")
        return name, source
    return name, CHAT_FORMATS.get(name, name)


def _check_chat_format(name: Any) -> None:
    """A chat_format that names no template is refused before the model is loaded."""
    if name is None or (isinstance(name, str) and (name.startswith("chat_template.")
                                                   or CHAT_FORMATS.get(name, name) in builtin_names()
                                                   or CHAT_FORMATS.get(name, name) in OWN_TEMPLATES)):
        return
    known = sorted(set(CHAT_FORMATS) | set(builtin_names()) | {DEFAULT_CHAT})
    raise InvalidParameterError(f"chat_format {name!r} is not one llamaplug knows; use one of {', '.join(known)}",
                                field="chat_format")


def _text(value: Any, field: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidParameterError(f"{field} is not UTF-8: {exc}", field=field) from None
    raise InvalidParameterError(f"{field} must be bytes (UTF-8) or str, got {type(value).__name__}", field=field)


def _grammar(value: Any) -> lp.Grammar | None:
    if value is None or isinstance(value, lp.Grammar):
        return value
    if isinstance(value, str):
        return lp.Grammar.from_string(value)
    raise InvalidParameterError(f"grammar must be a LlamaGrammar, got {type(value).__name__}", field="grammar")


def _limit(max_tokens: Any) -> int | None:
    if max_tokens is None:
        return None
    max_tokens = settings.int_of(max_tokens, "max_tokens")
    return None if max_tokens <= 0 else max_tokens


def _stops(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not all(isinstance(s, str) for s in stop):
        raise InvalidParameterError("stop must be a string or a list of strings", field="stop")
    return list(stop)


def _or_minus_one(token: int | None) -> int:
    return -1 if token is None else token


__all__ = ["Llama", "CHAT_FORMATS"]
