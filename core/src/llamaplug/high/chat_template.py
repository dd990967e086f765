"""Chat templates, rendered by llama.cpp's own Jinja engine (common/jinja of the pin, as llama-server does).

    template = ChatTemplate.for_model(model)              # tokenizer.chat_template, else llama.cpp's chatml
    prompt = template.render(messages, add_generation_prompt=True, tools=None)

The same engine renders every chat request (high/chat.py): a template renders here
exactly as it does in llama-server, with `raise_exception`, `strftime_now`, `tojson`,
`bos_token` / `eos_token`, `add_generation_prompt`, `tools` and any extra variables
(`render(..., enable_thinking=False)`). A template that does not compile or raises is a
`ChatTemplateError` with llama.cpp's message. A name instead of a template
(`ChatTemplate.builtin("llama3")`) renders with llama.cpp's `llama_chat_apply_template`.
"""

from __future__ import annotations

from typing import Any

from ..blocks.chat_builtin import builtin_names
from ..blocks.chat_layer import ChatTemplates
from ..blocks.model import LlamaModel
from ..errors import ChatTemplateError, InvalidParameterError
from .chat import OWN_TEMPLATES, chat_templates, is_builtin_name

__all__ = ["ChatTemplate", "builtin_names"]


class ChatTemplate:
    """A Jinja chat template (`source`), or a llama.cpp built-in one (`name`), optionally of a model
    (whose BOS/EOS tokens it gets, and whose BOS the prompt leaves out where tokenizing adds it)."""

    def __init__(self, source: str | None = None, name: str | None = None, bos_token: str = "",
                 eos_token: str = "", model: LlamaModel | None = None):
        self.source, self.name = source, name
        self.bos_token, self.eos_token = bos_token, eos_token
        self._model = model
        self._native = ChatTemplates(model, source if source is not None else name or "chatml", bos_token, eos_token)

    @classmethod
    def builtin(cls, name: str) -> ChatTemplate:
        names = builtin_names()
        if name not in names:
            raise InvalidParameterError(f"no built-in chat template {name!r}; llama.cpp has {', '.join(names)}",
                                        field="chat_template")
        return cls(name=name)

    @classmethod
    def for_model(cls, model: LlamaModel, override: str | None = None) -> ChatTemplate:
        """`override` (a Jinja template or a built-in name), else the GGUF's template, else llama.cpp's chatml: a
        view of the templates the chat path renders with (chat.chat_templates: made once per model)."""
        builtin = is_builtin_name(override)  # an unknown name raises, naming the known ones
        native = chat_templates(model, override)
        view = cls.__new__(cls)
        if override is None:
            source = model.chat_template or None
            view.source, view.name = source, None if source else "chatml"
        elif builtin or override == "chatml":
            view.source, view.name = None, override
        else:
            view.source, view.name = OWN_TEMPLATES.get(override, override), None
        view.bos_token, view.eos_token = _token_text(model, model.bos), _token_text(model, model.eos)
        view._model, view._native = model, native
        return view

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, **extra: Any) -> str:
        request: dict[str, Any] = {"messages": messages, "add_generation_prompt": add_generation_prompt,
                                   "prefill_assistant": False, "reasoning_format": "none",
                                   "force_pure_content": True}  # the rendering alone (no reply parser)
        if tools:
            request["tools"] = tools
        if extra:
            request["chat_template_kwargs"] = extra
        if self.source is None and self.name not in (None, "chatml"):
            request["use_jinja"] = False
        try:
            return self._native.apply(request)["prompt"]
        except InvalidParameterError as exc:
            raise ChatTemplateError(f"the chat template failed: {exc}") from None

    def __repr__(self) -> str:
        return f"<ChatTemplate {'jinja' if self.source else self.name}>"


def _token_text(model: LlamaModel, token: int | None) -> str:
    return "" if token is None else model.token_to_str(token, 0, True)
