"""Chat completions in OpenAI's shapes: the messages through the model's chat template, then a completion.

`out.choices[0].message.content`, `finish_reason`, `usage`; `out.model_dump()` is the
OpenAI JSON. Streaming yields `ChatCompletionChunk`s whose deltas join to the content.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from .. import plugins
from ..errors import InvalidParameterError
from .chat_template import ChatTemplate
from .completion import Completion, CompletionChunk, StopReason
from .structured import model_class, parse_reply
from .tool_calls import FunctionCall, ToolCall, parse

if TYPE_CHECKING:
    from .llama import Llama

ROLES = ("system", "developer", "user", "assistant", "tool")
FinishReason = Literal["stop", "length", "tool_calls"]


class ChatMessage(BaseModel):
    role: str
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    # The reply as the pydantic model given as response_format (Python only: not in the JSON).
    parsed: Any = Field(None, exclude=True)


class Choice(BaseModel):
    index: int
    message: ChatMessage
    finish_reason: FinishReason
    logprobs: None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class DeltaToolCall(BaseModel):
    index: int
    id: str
    type: str = "function"
    function: FunctionCall


class Delta(BaseModel):
    role: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None  # stream_options {"include_usage": true}: the last chunk's, with no choices


def _finish(reason: StopReason | None) -> FinishReason:
    return "stop" if reason in (StopReason.EOS, StopReason.STOP_SEQUENCE, StopReason.CANCELLED) else "length"


def _media_needs() -> str:
    found = plugins.providers("llamaplug_open_projector")
    if not found:
        return "the multimodal plugin (pip install llamaplug-mtmd) and LlamaParams(mmproj_path=...)"
    return f"a projector: LlamaParams(mmproj_path=...) ({', '.join(found)} is installed)"


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as plain dicts, each checked: a role we know, text content (parts of type text)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidParameterError("messages must be a non-empty list", field="messages")
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, BaseModel):
            m = m.model_dump(exclude_none=True)
        if not isinstance(m, dict):
            raise InvalidParameterError(f"messages[{i}] must be a dict with role and content", field=f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise InvalidParameterError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                                        field=f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif kind in ("image_url", "input_audio"):
                    raise InvalidParameterError(f"messages[{i}].content[{j}]: {kind} needs {_media_needs()}",
                                                field=f"messages[{i}].content[{j}]")
                else:
                    raise InvalidParameterError(f"messages[{i}].content[{j}] must be a text part",
                                                field=f"messages[{i}].content[{j}]")
            content = "\n".join(texts)  # as llama.cpp's server joins text parts
        if content is None and role == "assistant" and m.get("tool_calls"):
            content = ""
        if not isinstance(content, str):
            raise InvalidParameterError(f"messages[{i}].content must be text", field=f"messages[{i}].content")
        out.append({**m, "content": content})
    return out


def split_reasoning(text: str) -> tuple[str, str | None]:
    """(content, reasoning): a leading <think>...</think> block is the reasoning."""
    stripped = text.lstrip()
    if stripped.startswith("<think>") and "</think>" in stripped:
        reasoning, _, rest = stripped[len("<think>"):].partition("</think>")
        return rest.lstrip(), reasoning.strip()
    return text, None


def as_chat(completion: Completion, model: str, tool_kind: str | None = None,
            response_format: Any = None) -> ChatCompletion:
    """The ChatCompletion of a finished reply; with a pydantic model as `response_format`, message.parsed is one."""
    content, reasoning = split_reasoning(completion.text)
    calls: list[ToolCall] = []
    if tool_kind is not None:
        content, calls = parse(content or "", tool_kind)
    n_prompt, n_out = completion.timings.prompt_tokens, len(completion.tokens)  # media positions included
    finish: FinishReason = "tool_calls" if calls else _finish(completion.stop_reason)
    cls = model_class(response_format)
    parsed = parse_reply(cls, content, finish) if cls is not None and not calls else None
    message = ChatMessage(role="assistant", content=content, reasoning_content=reasoning, tool_calls=calls or None,
                          parsed=parsed)
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex[:24]}", created=int(time.time()), model=model,
        choices=[Choice(index=0, message=message, finish_reason=finish)],
        usage=Usage(prompt_tokens=n_prompt, completion_tokens=n_out, total_tokens=n_prompt + n_out))


def as_chunks(chunks: Iterator[CompletionChunk], model: str, tool_kind: str | None = None
              ) -> Iterator[ChatCompletionChunk]:
    """OpenAI's stream of a completion's chunks (see ChatStream)."""
    stream = ChatStream(model, tool_kind)
    yield stream.first()
    for piece in chunks:
        yield from stream.feed(piece)


class ChatStream:
    """Completion chunks in, OpenAI chat chunks out: the same for threads and asyncio.

    With tools, text that is surely content streams as it comes; text that may be a call
    is held, and each call goes out as one delta (id, name, arguments) once it is
    complete (in the hermes format each as its </tool_call> arrives, else at the end).
    The reply's end is parsed as as_chat parses it, so the deltas join to its message.
    """

    def __init__(self, model: str, tool_kind: str | None = None):
        self.ident, self.created, self.model = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), model
        self.tool_kind = tool_kind
        self._text = ""  # the reply so far (with tools)
        self._sent = ""  # the content sent so far (with tools)
        self._calls: list[ToolCall] = []  # the calls sent so far

    def chunk(self, delta: Delta, finish: FinishReason | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.ident, created=self.created, model=self.model,
                                   choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish)])

    def first(self) -> ChatCompletionChunk:
        return self.chunk(Delta(role="assistant", content=""))

    def feed(self, piece: CompletionChunk) -> list[ChatCompletionChunk]:
        if self.tool_kind is None:
            out = [self.chunk(Delta(content=piece.text))] if piece.text else []
            if piece.stop_reason is not None:
                out.append(self.chunk(Delta(), _finish(piece.stop_reason)))
            return out
        self._text += piece.text
        if piece.stop_reason is None:
            return self._progress(self.tool_kind)
        return self._end(self.tool_kind, piece.stop_reason)

    def _progress(self, kind: str) -> list[ChatCompletionChunk]:
        out = []
        live = sure_content(self._text, kind)
        if len(live) > len(self._sent) and live.startswith(self._sent):
            out.append(self.chunk(Delta(content=live[len(self._sent):])))
            self._sent = live
        closed = self._text.rfind(_HERMES_END) if kind == "hermes" else -1
        if closed >= 0:
            out += self._new_calls(parse(self._text[:closed + len(_HERMES_END)], kind)[1])
        return out

    def _end(self, kind: str, reason: StopReason) -> list[ChatCompletionChunk]:
        content, calls = parse(self._text, kind)
        content = content or ""
        if not content.startswith(self._sent):
            content = content.lstrip()  # what was sent skipped the leading whitespace (sure_content)
        out = []
        if content.startswith(self._sent) and len(content) > len(self._sent):
            out.append(self.chunk(Delta(content=content[len(self._sent):])))
        out += self._new_calls(calls)
        return out + [self.chunk(Delta(), "tool_calls" if self._calls else _finish(reason))]

    def _new_calls(self, calls: list[ToolCall]) -> list[ChatCompletionChunk]:
        new = calls[len(self._calls):]
        if not new:
            return []
        start = len(self._calls)
        self._calls += new
        return [self.chunk(Delta(tool_calls=[DeltaToolCall(index=start + i, id=c.id, function=c.function)
                                             for i, c in enumerate(new)]))]


_HERMES_END = "</tool_call>"
_MARKERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]"}
_PYTHON_TAG = "<|python_tag|>"


def sure_content(text: str, kind: str) -> str:
    """The start of a reply in progress that is content whatever follows, stripped (tool_calls.parse strips it).

    Before a call marker (hermes, mistral), minus a tail that may be a marker's start; for
    the one-object formats, nothing once the reply may be an object (it starts with { or <|python_tag|>).
    """
    marker = _MARKERS.get(kind)
    if marker is None:
        head = text.lstrip()
        if head.startswith(("{", _PYTHON_TAG)) or _PYTHON_TAG.startswith(head):
            return ""
        return text.strip()
    cut = text.find(marker)
    if cut >= 0:
        return text[:cut].strip()
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            text = text[:-k]
            break
    return text.strip()


def render(llama: Llama, messages: list[dict[str, Any]], chat_template: str | None,
           tools: list[dict[str, Any]] | None) -> tuple[list[int], ChatTemplate]:
    prompt, template = render_prompt(llama, messages, chat_template, tools)
    return llama.model.tokenize(prompt, llama.model.add_bos, special=True), template


def render_prompt(llama: Llama, messages: list[dict[str, Any]], chat_template: str | None,
                  tools: list[dict[str, Any]] | None) -> tuple[str, ChatTemplate]:
    template = ChatTemplate.for_model(llama.model, chat_template)
    if "<|channel|>" not in (template.source or ""):  # as llama.cpp: developer is system, but for GPT-OSS
        messages = [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]
    prefill = messages[-1]["content"] if messages[-1]["role"] == "assistant" else None
    if prefill is not None and len(messages) > 1 and messages[-2]["role"] == "assistant":
        raise InvalidParameterError("messages end with two assistant messages: only the last may be a prefill",
                                    field=f"messages[{len(messages) - 1}]")
    prompt = template.render(messages, add_generation_prompt=prefill is None, tools=tools)
    if prefill:
        # An assistant message last is the start of the reply: the prompt stops right after its text.
        cut = prompt.rfind(prefill)
        if cut < 0:
            raise InvalidParameterError("the chat template dropped the last assistant message, so it cannot be "
                                        "continued", field=f"messages[{len(messages) - 1}]")
        prompt = prompt[: cut + len(prefill)]
    if llama.model.add_bos and template.bos_token and prompt.startswith(template.bos_token):
        # Tokenizing adds the BOS for such a model; llama.cpp drops the template's, so do we (no double BOS).
        prompt = prompt[len(template.bos_token):]
    return prompt, template
