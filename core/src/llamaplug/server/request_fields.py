"""llama-server's request fields beyond OpenAI's, read as it reads them: logit_bias in both of its shapes, grammar
and json_schema, logprobs as its `completion_probabilities` and OpenAI's `logprobs.content`, prompt progress.

Shared by the chat route and /completion, so one field means one thing on both.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from ..blocks.grammar import Grammar
from ..high.completion import PromptProgress, TokenLogprob
from .errors import BadRequestError

if TYPE_CHECKING:
    from .openai.schemas import LogitBias

def logit_bias(model: Any, given: LogitBias | None, ignore_eos: bool = False) -> dict[int, float]:
    """token id -> bias, as llama-server's schema reads it: a text key is its tokens (each biased), false is
    -inf, an id outside the vocabulary a 400 (llama-server skips it; a wrong id is the client's mistake).
    `ignore_eos` adds every end-of-generation token at -inf after them, as llama-server's ignore_eos field."""
    eog = dict.fromkeys(model.eog_tokens, -math.inf) if ignore_eos else {}
    if not given:
        return eog
    pairs = given.items() if isinstance(given, dict) else [tuple(p) for p in given]
    out: dict[int, float] = {}
    for pair in pairs:
        if len(pair) != 2:
            raise BadRequestError(f"logit_bias: {list(pair)!r} is not a [token, bias] pair", param="logit_bias")
        key, bias = pair
        if bias is False:
            value = -math.inf
        elif isinstance(bias, (int, float)) and not isinstance(bias, bool):
            value = float(bias)
        else:
            raise BadRequestError(f"logit_bias: the bias of {key!r} must be a number or false, got {bias!r}",
                                  param="logit_bias")
        for token in _tokens(model, key):
            out[token] = value
    return {**out, **eog}


def _tokens(model: Any, key: Any) -> list[int]:
    if isinstance(key, int) and not isinstance(key, bool):
        ident = key
    elif isinstance(key, str) and key.lstrip("-").isdecimal() and key.count("-") <= 1:
        ident = int(key)
    elif isinstance(key, str):
        return [int(t) for t in model.tokenize(key, False, False)]
    else:
        raise BadRequestError(f"logit_bias: {key!r} is neither a token id nor a text", param="logit_bias")
    if not 0 <= ident < model.n_vocab:
        raise BadRequestError(f"logit_bias: token id {ident} is outside the vocabulary (0..{model.n_vocab - 1})",
                              param="logit_bias")
    return [ident]


def grammar_text(grammar: str | None, json_schema: dict[str, Any] | None) -> str | None:
    """The GBNF that llama-server's `grammar` (GBNF) or `json_schema` field asks for (None: neither)."""
    if grammar and json_schema is not None:
        raise BadRequestError("Cannot use both json_schema and grammar", param="grammar")
    if json_schema is not None:
        return Grammar.from_json_schema(json_schema or {"type": "object"}).source  # {}: any object, as there
    return grammar or None


def _piece(model: Any, token: int) -> tuple[str, list[int]]:
    raw = model.token_to_piece(token)
    return raw.decode("utf-8", errors="ignore"), list(raw)  # as llama-server: an incomplete character is cut


def token_entry(model: Any, lp: TokenLogprob, post: bool = False) -> dict[str, Any]:
    """One sampled token as llama-server writes it (id, token, bytes, logprob, top_logprobs), the same in
    /completion's completion_probabilities and in a chat choice's logprobs.content. `post`: its
    post_sampling_probs names (prob, top_probs) with probabilities in place of log probabilities."""
    text, raw = _piece(model, lp.token)
    key, top_key = ("prob", "top_probs") if post else ("logprob", "top_logprobs")
    top = []
    for token, value in lp.top:
        t_text, t_raw = _piece(model, token)
        top.append({"id": token, "token": t_text, "bytes": t_raw, key: math.exp(value) if post else value})
    return {"id": lp.token, "token": text, "bytes": raw, key: math.exp(lp.logprob) if post else lp.logprob,
            top_key: top}


def progress_fields(progress: PromptProgress) -> dict[str, Any]:
    """llama-server's prompt_progress object of one of the engine's reports (Job.progress)."""
    return dataclasses.asdict(progress)
