"""Chat templates: the GGUF's own Jinja template in a sandbox, or one of llama.cpp's built-in ones.

    template = ChatTemplate.for_model(model)              # tokenizer.chat_template, else llama.cpp's default
    prompt = template.render(messages, add_generation_prompt=True, tools=None)

The Jinja environment is sandboxed and immutable (a template cannot reach Python
objects or change its inputs) and has what the templates published with models use:
`raise_exception`, `strftime_now`, `tojson`, `bos_token` / `eos_token`,
`add_generation_prompt`, `tools`. A template that raises is a `ChatTemplateError`
with the template's own message. A name instead of a template
(`ChatTemplate.builtin("chatml")`) renders with llama.cpp's `llama_chat_apply_template`.
"""

from __future__ import annotations

import datetime
import functools
import json
from typing import Any

from ..blocks.chat_builtin import apply_builtin, builtin_names
from ..blocks.model import LlamaModel
from ..errors import ChatTemplateError, InvalidParameterError


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"the chat template refused the messages: {message}")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@functools.cache
def _environment() -> Any:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    return env


@functools.lru_cache(maxsize=64)
def _compile(source: str) -> Any:
    """The compiled template of `source`, once per source: compiling takes far longer than rendering, and a
    server renders the same model's template for every chat request (a compiled template renders from any thread)."""
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the chat template does not compile: {exc}") from None


class ChatTemplate:
    """A Jinja chat template (`source`), or a llama.cpp built-in one (`name`)."""

    def __init__(self, source: str | None = None, name: str | None = None, bos_token: str = "",
                 eos_token: str = ""):
        self.source, self.name = source, name
        self.bos_token, self.eos_token = bos_token, eos_token
        self._compiled: Any = _compile(source) if source is not None else None

    @classmethod
    def builtin(cls, name: str) -> ChatTemplate:
        names = builtin_names()
        if name not in names:
            raise InvalidParameterError(f"no built-in chat template {name!r}; llama.cpp has {', '.join(names)}",
                                        field="chat_template")
        return cls(name=name)

    @classmethod
    def for_model(cls, model: LlamaModel, override: str | None = None) -> ChatTemplate:
        """`override` (a Jinja template or a built-in name), else the GGUF's template, else llama.cpp's chatml."""
        special = {"bos_token": _token_text(model, model.bos), "eos_token": _token_text(model, model.eos)}
        if override is not None:
            if not isinstance(override, str) or not override.strip():
                raise InvalidParameterError("chat_template must be a Jinja template or a built-in name",
                                            field="chat_template")
            if "{{" in override or "{%" in override:
                return cls(override, **special)
            return cls.builtin(override)
        source = model.chat_template
        return cls(source, **special) if source else cls(name="chatml")

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, **extra: Any) -> str:
        if self._compiled is None:
            return apply_builtin(self.name, messages, add_generation_prompt)
        import jinja2

        try:
            return self._compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         tools=tools, bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise ChatTemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from None

    @property
    def renders_tools(self) -> bool:
        """Whether the template puts `tools` into the prompt (llama.cpp's test: render a tool, look for its name)."""
        return self.source is not None and _renders_tools(self.source)

    def __repr__(self) -> str:
        return f"<ChatTemplate {'jinja' if self.source else self.name}>"


_PROBE_TOOL = "llamaplug_probe_tool_name"


@functools.lru_cache(maxsize=64)
def _renders_tools(source: str) -> bool:
    tool = {"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe",
                                             "parameters": {"type": "object", "properties": {}}}}
    try:
        text = ChatTemplate(source).render([{"role": "user", "content": "hi"}], tools=[tool])
    except ChatTemplateError:
        return False
    return _PROBE_TOOL in text


def require_tools_rendered(template: ChatTemplate, model_name: str) -> None:
    """Refuse tools that the template would drop without a word (tool_choice "auto"): the model would never see
    them, so never call one."""
    if not template.renders_tools:
        raise ChatTemplateError(
            f"the chat template of {model_name} does not render tools, so the model would never see them: use a "
            "model whose template takes tools (Qwen2.5, Llama 3.1, Mistral, Hermes...), pass chat_template= one "
            "that does, describe the tools in a system message yourself, or force a call with "
            'tool_choice="required" (its grammar makes the model call one)')


def _token_text(model: LlamaModel, token: int | None) -> str:
    return "" if token is None else model.token_to_str(token, 0, True)
