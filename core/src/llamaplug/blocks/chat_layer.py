"""llama.cpp's own chat layer (the pin's common/chat.h), as llama-server uses it, behind a JSON shim.

    templates = ChatTemplates(model)                     # the GGUF's template(s), or an override
    params = templates.apply({"messages": [...], "tools": [...], "tool_choice": "auto"})
    params["prompt"], params["grammar"], params["grammar_triggers"], params["parser"], ...
    stream = ChatReplyParser(params)                     # one per reply
    diffs = stream.update("<tool_call>{...", partial=True)   # llama-server's deltas

Every template llama-server serves renders, constrains and parses the same way here: the
tool-call grammar and its lazy triggers, the PEG parser that splits a reply into content,
reasoning_content and tool_calls (whole or partial), and the streamed deltas. The shim
(core/native/chat_shim.cpp, in libllamaplug-common) takes and returns JSON; a C++ exception
comes back as a message and is raised here as a LlamaError subclass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import ChatTemplateError, InvalidParameterError, SamplingError
from ..raw import ffi, lib
from ._handle import NativeHandle
from ._shim import call_shim, encode_json
from .tool_choice import call_first

# common_grammar_trigger_type
TRIGGER_TOKEN, TRIGGER_WORD, TRIGGER_PATTERN, TRIGGER_PATTERN_FULL = range(4)
REASONING_FORMATS = ("none", "auto", "deepseek-legacy", "deepseek")


def _json_out(ptr: Any) -> Any:
    try:
        return json.loads(ffi.string(ptr).decode("utf-8"))
    finally:
        lib.llamaplug_chat_string_free(ptr)


def _text(value: str, field: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidParameterError(f"{field} holds text that is not valid Unicode (a lone surrogate)",
                                    field=field) from None


class ChatTemplates(NativeHandle):
    """llama.cpp's chat templates of a model: its own (default and tool_use variants), or `override`
    (Jinja text, or the name of one of llama.cpp's built-in templates)."""

    _what = "chat template set"

    def __init__(self, model: Any, override: str | None = None, bos_token: str = "", eos_token: str = ""):
        if model is None and not override:
            raise InvalidParameterError("a chat template needs a model or a template text", field="chat_template")
        raw_model = ffi.NULL if model is None else model._ptr
        source = ffi.NULL if override is None else ffi.new("char[]", _text(override, "chat_template"))
        ptr = call_shim(lib.llamaplug_chat_templates_new, raw_model, source, _text(bos_token, "bos_token"),
                        _text(eos_token, "eos_token"))
        if ptr == ffi.NULL:
            raise ChatTemplateError("llama.cpp could not set up the chat template")
        self._adopt(ptr, lib.llamaplug_chat_templates_free)
        if model is not None:
            model.add_dependent(self)
        self._info: dict[str, Any] | None = None

    @property
    def info(self) -> dict[str, Any]:
        """{"source", "tool_use_source", "caps": {...}, "supports_enable_thinking"}."""
        if self._info is None:
            self._info = _json_out(call_shim(lib.llamaplug_chat_templates_info, self._ptr))
        return self._info

    def apply(self, request: dict[str, Any]) -> dict[str, Any]:
        """llama-server's chat fields (messages, tools, tool_choice, json_schema, grammar, parallel_tool_calls,
        add_generation_prompt, continue_final_message, reasoning_format, enable_thinking, chat_template_kwargs,
        reasoning_effort) -> prompt, format, grammar, grammar_lazy, grammar_triggers, preserved_tokens,
        additional_stops, generation_prompt, parser, thinking tags, parse_tool_calls, reasoning_format."""
        body = encode_json(request, "messages")
        try:
            out = call_shim(lib.llamaplug_chat_apply, self._ptr, body, what="the chat template failed: ")
        except InvalidParameterError as exc:
            if "Jinja Exception" in str(exc) or "Unable to generate parser" in str(exc):
                # llama.cpp reports a template that raises while it analyses it as a bad request: the template's
                raise ChatTemplateError(str(exc)) from None
            raise
        params = _json_out(out)
        if request.get("tool_choice") == "required" and params.get("grammar"):
            # Beyond llama-server: its "required" grammar lets text come first, and a model that writes text
            # never calls (tool_choice.py); the call starts after the thinking block instead.
            params["grammar"] = call_first(params, request.get("parallel_tool_calls"), request.get("tools"))
        return params


def parser_params(params: dict[str, Any], reasoning_format: str | None = None, stream: bool = False
                  ) -> dict[str, Any]:
    """What the reply parser needs of apply()'s result; `reasoning_format` overrides the request's one.

    As llama-server: "deepseek-legacy" leaves the thinking inline while streaming."""
    fmt = reasoning_format or params.get("reasoning_format", "auto")
    return {"format": params["format"], "reasoning_format": fmt, "generation_prompt": params["generation_prompt"],
            "parse_tool_calls": params["parse_tool_calls"], "is_continuation": params["is_continuation"],
            "parser": params["parser"], "reasoning_in_content": stream and fmt == "deepseek-legacy"}


def parse_reply(params: dict[str, Any], text: str, partial: bool = False) -> dict[str, Any]:
    """One reply (whole, or a prefix with `partial`) as {role, content, reasoning_content, tool_calls}."""
    out = call_shim(lib.llamaplug_chat_parse, encode_json(params, "parser"), _text(text, "reply"), int(partial),
                error=ChatTemplateError, what="llama.cpp's chat parser failed: ")
    return _json_out(out)


class ChatReplyParser(NativeHandle):
    """The state of one streamed reply, as llama-server keeps it: feed the text as it comes, get the
    message so far and the deltas (reasoning_content, content, tool-call name/arguments pieces)."""

    _what = "chat reply parser"

    def __init__(self, params: dict[str, Any]):
        ptr = call_shim(lib.llamaplug_chat_stream_new, encode_json(params, "parser"), what="llama.cpp's chat parser: ")
        self._adopt(ptr, lib.llamaplug_chat_stream_free)

    def update(self, added: str, partial: bool = True) -> list[dict[str, Any]]:
        """The deltas `added` makes: {reasoning_content, content, index (-1: none), id, name, arguments}."""
        return _json_out(call_shim(lib.llamaplug_chat_stream_update, self._ptr, _text(added, "reply"), int(partial),
                                   what="llama.cpp's chat parser failed: "))


def regex_escape(word: str) -> str:
    """common.cpp's regex_escape: a trigger word as a pattern."""
    special = set(".^$|()*+?[]{}\\")
    return "".join("\\" + c if c in special else c for c in word)


def grammar_triggers(params: dict[str, Any], tokenize: Any) -> tuple[list[str], list[int]]:
    """(trigger patterns, trigger tokens) of a lazy grammar, as llama-server and common/sampling.cpp make them:
    a trigger word that is one preserved token triggers on that token; other words become escaped patterns."""
    preserved = set(preserved_tokens(params, tokenize))
    patterns: list[str] = []
    tokens: list[int] = []
    for trigger in params.get("grammar_triggers", []):
        kind, value = trigger["type"], trigger["value"]
        if kind == TRIGGER_WORD:
            ids = tokenize(value)
            if len(ids) == 1:
                if ids[0] not in preserved:
                    raise SamplingError(f"grammar trigger word {value!r} is one token but not a preserved token")
                tokens.append(ids[0])
            else:
                patterns.append(regex_escape(value))
        elif kind == TRIGGER_PATTERN:
            patterns.append(value)
        elif kind == TRIGGER_PATTERN_FULL:  # anchored at both ends
            start = "" if value.startswith("^") else "^"
            end = "" if value.endswith("$") else "$"
            patterns.append(start + value + end if value else "^$")
        elif kind == TRIGGER_TOKEN:
            tokens.append(int(trigger["token"]))
    return patterns, tokens


def preserved_tokens(params: dict[str, Any], tokenize: Any) -> list[int]:
    """The ids of the preserved tokens that are single tokens (their text is kept in the reply)."""
    out = []
    for text in params.get("preserved_tokens", []):
        ids = tokenize(text)
        if len(ids) == 1:
            out.append(ids[0])
    return out


def grammar_prefill(sampler_ptr: Any, tokens: Sequence[int]) -> None:
    """Feed the generation prompt's tokens to a (non-lazy) tool-call grammar, as common/sampling.cpp does."""
    if not tokens:
        return
    arr = ffi.new("llama_token[]", list(tokens))
    err = ffi.new("char **")
    rc = lib.llamaplug_chat_grammar_prefill(sampler_ptr, arr, len(tokens), err)
    if rc != 0:
        message = ffi.string(err[0]).decode("utf-8", "replace") if err[0] != ffi.NULL else "refused"
        if err[0] != ffi.NULL:
            lib.llamaplug_chat_string_free(err[0])
        raise SamplingError(f"the tool-call grammar refused the template's generation prompt: {message}")


def reasoning_budget_ptr(vocab: Any, start: Sequence[int], ends: Sequence[Sequence[int]], forced: Sequence[int],
                         budget: int, prefill: Sequence[int] = ()) -> Any:
    """llama-server's reasoning budget sampler (common/reasoning-budget.h; see SamplerChain.reasoning_budget)."""
    flat = [t for seq in ends for t in seq]
    ptr = call_shim(lib.llamaplug_reasoning_budget_new, vocab, ffi.new("llama_token[]", list(start)), len(start),
                    ffi.new("llama_token[]", flat), ffi.new("size_t[]", [len(seq) for seq in ends]), len(ends),
                    ffi.new("llama_token[]", list(forced)), len(forced), budget,
                    ffi.new("llama_token[]", list(prefill)), len(prefill),
                    error=SamplingError, what="llama.cpp's reasoning budget: ")
    if ptr == ffi.NULL:
        raise SamplingError("llama.cpp could not make the reasoning budget sampler")
    return ptr
