"""llama.cpp's built-in chat templates (llama_chat_apply_template), by name: "chatml", "llama3", ...

The names a chat_template may give instead of Jinja text; the chat layer (chat_layer.py) renders them
as llama-server does, through llama.cpp's own code, like every other template.
"""

from __future__ import annotations

from ..raw import ffi, lib


def builtin_names() -> list[str]:
    """The template names llama.cpp's llama_chat_apply_template knows."""
    n = lib.llama_chat_builtin_templates(ffi.NULL, 0)
    names = ffi.new("const char *[]", n)
    lib.llama_chat_builtin_templates(names, n)
    return [ffi.string(names[i]).decode() for i in range(n)]
