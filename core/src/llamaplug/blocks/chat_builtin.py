"""llama.cpp's built-in chat templates (llama_chat_apply_template), by name: "chatml", "llama3", ...

The Jinja templates of GGUF files are rendered in Python (high/chat_template.py); these are
the ones llama.cpp hard-codes, for a name given instead of a template.
"""

from __future__ import annotations

from typing import Any

from ..errors import ChatTemplateError, InvalidParameterError, native_error
from ..raw import ffi, lib
from . import _native_log


def builtin_names() -> list[str]:
    """The template names llama.cpp's llama_chat_apply_template knows."""
    n = lib.llama_chat_builtin_templates(ffi.NULL, 0)
    names = ffi.new("const char *[]", n)
    lib.llama_chat_builtin_templates(names, n)
    return [ffi.string(names[i]).decode() for i in range(n)]


def apply_builtin(name: str | None, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    """`messages` rendered by the built-in template `name` (None: llama.cpp's default); text contents only."""
    keep = []
    c_msgs = ffi.new("struct llama_chat_message[]", len(messages))
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, str):
            raise InvalidParameterError(f"messages[{i}].content: the built-in template {name!r} takes "
                                        "text only", field=f"messages[{i}].content")
        role, text = ffi.new("char[]", m["role"].encode()), ffi.new("char[]", content.encode())
        keep += [role, text]
        c_msgs[i].role, c_msgs[i].content = role, text
    size = 2 * sum(len(m["content"]) + len(m["role"]) for m in messages) + 256
    c_name = name.encode() if name else ffi.NULL
    for _ in range(2):
        buf = ffi.new("char[]", size)
        with _native_log.capture_errors() as errors:
            n = lib.llama_chat_apply_template(c_name, c_msgs, len(messages), add_generation_prompt, buf, size)
        if n < 0:
            raise native_error(ChatTemplateError, f"llama.cpp cannot apply the chat template {name!r}", errors)
        if n < size:
            return ffi.unpack(buf, n).decode("utf-8", "replace")
        size = n + 1
    raise ChatTemplateError("llama.cpp's chat template output kept growing")
