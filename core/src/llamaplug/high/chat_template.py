"""Chat templates, rendered by llama.cpp's own Jinja engine (common/jinja of the pin, as llama-server does).

    template = ChatTemplate.for_model(model)              # tokenizer.chat_template, else llama.cpp's chatml
    prompt = template.render(messages, add_generation_prompt=True, tools=None)

The same engine renders every chat request (chat_plan.py, through the per-model cache of `chat_templates` here,
of which a ChatTemplate is a view): a template renders here
exactly as it does in llama-server, with `raise_exception`, `strftime_now`, `tojson`,
`bos_token` / `eos_token`, `add_generation_prompt`, `tools` and any extra variables
(`render(..., enable_thinking=False)`). A template that does not compile or raises is a
`ChatTemplateError` with llama.cpp's message. A name instead of a template
(`ChatTemplate.builtin("llama3")`) renders with llama.cpp's `llama_chat_apply_template`.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ..blocks.chat_builtin import builtin_names
from ..blocks.chat_layer import ChatTemplates
from ..blocks.model import LlamaModel
from ..errors import ChatTemplateError, InvalidParameterError

__all__ = ["CHATML_TOOLS", "OWN_TEMPLATES", "ChatTemplate", "builtin_names", "chat_templates", "is_builtin_name",
           "template_source"]

# llamaplug's own name for a template: ChatML with tools in the Hermes format (<tool_call>...</tool_call>), for
# ChatML models whose own template has no place for tools (SmolLM2's): chat_template="chatml-tools".
CHATML_TOOLS = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content }}
    {%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
    {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' ~
        'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' ~
        'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, ' ~
        '\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first)
          or (message.role == 'assistant' and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
        {%- for call in message.tool_calls %}
            {%- if call.function is defined %}{%- set call = call.function %}{%- endif %}
            {{- '\\n<tool_call>\\n{\\"name\\": \\"' + call.name + '\\", \\"arguments\\": ' }}
            {{- call.arguments | tojson }}{{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""
OWN_TEMPLATES = {"chatml-tools": CHATML_TOOLS}


def template_source(override: str) -> str:
    """The Jinja text an override names: one of llamaplug's own templates by name, else the override itself."""
    return OWN_TEMPLATES.get(override, override)


_templates: weakref.WeakKeyDictionary[Any, dict[str | None, ChatTemplates]] = weakref.WeakKeyDictionary()
_templates_lock = threading.Lock()


def chat_templates(model: LlamaModel, override: str | None = None) -> ChatTemplates:
    """llama.cpp's templates of `model` (or `override`: Jinja text or a built-in name), made once per model."""
    _check_override(override)
    override = template_source(override) if override is not None else None
    with _templates_lock:
        per_model = _templates.setdefault(model, {})
        found = per_model.get(override)
        if found is None or found.closed:
            found = per_model[override] = ChatTemplates(model, override)
        return found


def _check_override(override: Any) -> None:
    if override is not None and (not isinstance(override, str) or not override.strip()):
        raise InvalidParameterError("chat_template must be a Jinja template or a built-in name", field="chat_template")


def is_builtin_name(override: str | None) -> bool:
    """Whether `override` names one of llama.cpp's built-in templates other than chatml (which has a Jinja source);
    a name that is none of them (not Jinja either) raises, naming the known ones."""
    _check_override(override)
    if override is None or "{{" in override or "{%" in override or override in OWN_TEMPLATES:
        return False
    if override not in builtin_names():
        raise InvalidParameterError(f"no built-in chat template {override!r}; llama.cpp has "
                                    f"{', '.join(builtin_names())}, llamaplug {', '.join(OWN_TEMPLATES)} (or give a "
                                    "Jinja template)", field="chat_template")
    return override != "chatml"  # chatml has a Jinja source in the chat layer


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
        view of the templates the chat path renders with (chat_templates: made once per model)."""
        builtin = is_builtin_name(override)  # an unknown name raises, naming the known ones
        native = chat_templates(model, override)
        view = cls.__new__(cls)
        if override is None:
            source = model.chat_template or None
            view.source, view.name = source, None if source else "chatml"
        elif builtin or override == "chatml":
            view.source, view.name = None, override
        else:
            view.source, view.name = template_source(override), None
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
