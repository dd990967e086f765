"""Sampling as keywords of a call (`temperature=0.7, seed=1`), and what a call's `sampler=` may be.

    llama.create_chat_completion(messages, temperature=0.7, seed=1)

The keywords are SamplerParams' fields, plus the names llama-cpp-python, OpenAI and
llama-server use for three of them (repeat_penalty, presence_penalty, frequency_penalty).
Any keyword gives exactly the chain SamplerParams builds (llama.cpp's common sampler:
its defaults, temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, for what is not given);
no keyword and no sampler is greedy, as before, with nothing built here.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from typing_extensions import TypedDict

from ..blocks.sampling import LlamaSampler, SamplerChain
from ..errors import InvalidParameterError
from ..params import SamplerName, SamplerParams

if TYPE_CHECKING:
    from .llama import Llama

# Other libraries' names for SamplerParams fields (llama-cpp-python, OpenAI, llama-server's request fields).
ALIASES = {"repeat_penalty": "penalty_repeat", "presence_penalty": "penalty_present",
           "frequency_penalty": "penalty_freq", "repeat_last_n": "penalty_last_n", "temp": "temperature",
           "mirostat_mode": "mirostat"}


class SamplingOptions(TypedDict, total=False):
    """The sampling keywords of create_completion, create_chat_completion and their plural and async forms."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    typical_p: float
    seed: int
    repeat_penalty: float
    presence_penalty: float
    frequency_penalty: float
    repeat_last_n: int
    logit_bias: dict[int, float]
    grammar: str
    min_keep: int
    dynatemp_range: float
    dynatemp_exponent: float
    xtc_probability: float
    xtc_threshold: float
    top_n_sigma: float
    penalty_last_n: int
    penalty_repeat: float
    penalty_freq: float
    penalty_present: float
    dry_multiplier: float
    dry_base: float
    dry_allowed_length: int
    dry_penalty_last_n: int
    dry_sequence_breakers: list[str]
    mirostat: Literal[0, 1, 2]
    mirostat_tau: float
    mirostat_eta: float
    adaptive_target: float
    adaptive_decay: float
    samplers: list[SamplerName]


def sampling_params(llama: Llama, options: Mapping[str, Any], call: str) -> SamplerParams:
    """The SamplerParams that a call's sampling keywords give (the Llama's seed where they give none)."""
    fields = {}
    for name, value in options.items():
        field = ALIASES.get(name, name)
        if field not in SamplerParams.model_fields:
            raise InvalidParameterError(f"{call}() got an unexpected keyword {name!r}{_did_you_mean(name)}",
                                        field=name)
        if field in fields:
            raise InvalidParameterError(f"{call}(): {name!r} and {field!r} are the same setting: give one",
                                        field=name)
        fields[field] = value
    fields.setdefault("seed", llama.params.seed)
    return SamplerParams(**fields)


def call_sampler(llama: Llama, sampler: Any, options: Mapping[str, Any], call: str) -> tuple[LlamaSampler | None, bool]:
    """(sampler, owned) for a call of one request: `sampler` as given (None, a LlamaSampler), "greedy", a
    SamplerParams, or the chain of the sampling keywords; owned ones were made here and the job closes them."""
    if options:
        if sampler is not None:
            raise InvalidParameterError(f"{call}(): give sampler= or sampling keywords ({', '.join(options)}), "
                                        "not both", field="sampler")
        return sampling_params(llama, options, call).build_chain(llama.model), True
    if sampler is None or isinstance(sampler, LlamaSampler):
        return sampler, False
    if sampler == "greedy":
        return SamplerChain().greedy(), True
    if isinstance(sampler, SamplerParams):
        return sampler.build_chain(llama.model), True
    raise InvalidParameterError(f'{call}(): sampler must be a LlamaSampler, a SamplerParams or "greedy", got '
                                f"{type(sampler).__name__} {sampler!r:.60}", field="sampler")


def calls_samplers(llama: Llama, sampler: Any, options: Mapping[str, Any], call: str) -> Any:
    """What a call of many requests passes to requests.samplers_for: its keywords as one SamplerParams."""
    if options:
        if sampler is not None:
            raise InvalidParameterError(f"{call}(): give sampler= or sampling keywords ({', '.join(options)}), "
                                        "not both", field="sampler")
        return sampling_params(llama, options, call)
    if sampler == "greedy":
        return lambda: SamplerChain().greedy()
    return sampler


# The calls' other keywords, for a misspelt one that lands in **sampling.
_CALL_WORDS = ("max_tokens", "sampler", "stop", "stream", "logprobs", "special", "response_format", "tools",
               "tool_choice", "chat_template", "suffix", "extra")


def _did_you_mean(name: str) -> str:
    known = [*SamplerParams.model_fields, *ALIASES, *_CALL_WORDS]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; the sampling keywords are {', '.join(sorted([*SamplerParams.model_fields, *ALIASES]))}"
