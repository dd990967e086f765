"""The dicts llama-cpp-python returns (llama_types.py's TypedDicts), made from llamaplug's results.

Text completions: `completion` (whole), `completion_chunk` (streamed: one per piece of text, then
one with the finish_reason and empty text). Chat: `chat` from a llamaplug ChatCompletion, and
`chat_chunk` from a ChatCompletionChunk (the first delta holds the role, the last is empty with
the finish_reason).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from llamaplug import ChatCompletion, ChatCompletionChunk, LlamaModel, StopReason, TokenLogprob


def finish_reason(reason: StopReason) -> str:
    return "length" if reason in (StopReason.MAX_TOKENS, StopReason.CONTEXT_FULL) else "stop"


def completion_id() -> tuple[str, int]:
    return f"cmpl-{uuid.uuid4()}", int(time.time())


def completion(ident: str, created: int, model: str, text: str, logprobs: dict[str, Any] | None, finish: str,
               n_prompt: int, n_completion: int) -> dict[str, Any]:
    return {
        "id": ident, "object": "text_completion", "created": created, "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
        "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
                  "total_tokens": n_prompt + n_completion},
    }


def completion_chunk(ident: str, created: int, model: str, text: str, logprobs: dict[str, Any] | None,
                     finish: str | None) -> dict[str, Any]:
    return {
        "id": ident, "object": "text_completion", "created": created, "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
    }


class Logprobs:
    """llama-cpp-python's CompletionLogprobs, built token by token: each token's text, its offset in the
    returned text, its log probability and the top alternatives ({text: logprob}, the token's own included)."""

    def __init__(self, model: LlamaModel, offset: int):
        self.model, self.offset = model, offset
        self.tokens: list[str] = []
        self.text_offset: list[int] = []
        self.token_logprobs: list[float] = []
        self.top_logprobs: list[dict[str, float]] = []

    def add(self, entries: list[TokenLogprob]) -> dict[str, Any]:
        """Add `entries`; the dict of these alone (a streamed chunk's)."""
        part = Logprobs(self.model, self.offset)
        for lp in entries:
            for target in (self, part):
                target._add(lp, self.offset)
            self.offset += len(lp.text)
        return part.as_dict()

    def _add(self, lp: TokenLogprob, offset: int) -> None:
        top = {self.model.token_to_piece(t).decode("utf-8", "ignore"): float(v) for t, v in lp.top}
        top[lp.text] = float(lp.logprob)
        self.tokens.append(lp.text)
        self.text_offset.append(offset)
        self.token_logprobs.append(float(lp.logprob))
        self.top_logprobs.append(top)

    def as_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "text_offset": self.text_offset, "token_logprobs": self.token_logprobs,
                "top_logprobs": self.top_logprobs}


def chat(out: ChatCompletion, model: str) -> dict[str, Any]:
    choice = out.choices[0]
    message: dict[str, Any] = {"role": "assistant", "content": choice.message.content}
    if choice.message.tool_calls:
        calls = [c.model_dump() for c in choice.message.tool_calls]
        message["tool_calls"] = calls
        message["function_call"] = dict(calls[0]["function"])  # the legacy field, as llama-cpp-python fills it
    if choice.message.reasoning_content is not None:
        message["reasoning_content"] = choice.message.reasoning_content
    return {
        "id": out.id, "object": "chat.completion", "created": out.created, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": choice.finish_reason}],
        "usage": out.usage.model_dump(),
    }


def chat_chunk(chunk: ChatCompletionChunk, model: str) -> dict[str, Any]:
    choice = chunk.choices[0]
    delta: dict[str, Any] = {}
    if choice.delta.role is not None:
        delta["role"] = choice.delta.role
    elif choice.delta.content:
        delta["content"] = choice.delta.content
    if choice.delta.tool_calls:
        delta["tool_calls"] = [c.model_dump() for c in choice.delta.tool_calls]
    return {
        "id": chunk.id, "model": model, "created": chunk.created, "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": choice.finish_reason}],
    }
