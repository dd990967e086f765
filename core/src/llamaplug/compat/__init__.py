"""Other libraries' APIs on llamaplug's engine, for code written against them.

`llamaplug.compat.llama_cpp` is llama-cpp-python's high-level API (`Llama`, `LlamaGrammar`,
`LogitsProcessorList`, ...); `install_as_llama_cpp()` makes `import llama_cpp` give it, the way
PyMySQL's `install_as_MySQLdb()` stands in for MySQLdb, so that libraries importing `llama_cpp`
(LangChain's `LlamaCpp`, ...) run on llamaplug without a change. See docs/from-llama-cpp-python.md.
"""

from __future__ import annotations

import sys

# The names under which llama-cpp-python's high-level API is imported: the package and the modules
# that hold what this one provides. Its ctypes layer (`llama_cpp.llama_cpp`) and `_internals` are not.
ALIASES = ("llama_cpp", "llama_cpp.llama", "llama_cpp.llama_grammar", "llama_cpp.llama_types")


def install_as_llama_cpp() -> None:
    """Make `import llama_cpp` (and `from llama_cpp.llama import Llama`, ...) give llamaplug.compat.llama_cpp.

    Call it before the code that imports llama_cpp runs; a real llama-cpp-python already imported is
    replaced in `sys.modules` for later imports (objects made from it stay what they are).
    """
    from . import llama_cpp

    for name in ALIASES:
        sys.modules[name] = llama_cpp


def uninstall_llama_cpp() -> None:
    """Undo install_as_llama_cpp: later `import llama_cpp` finds whatever is installed (or nothing)."""
    from . import llama_cpp

    for name in ALIASES:
        if sys.modules.get(name) is llama_cpp:
            del sys.modules[name]


__all__ = ["install_as_llama_cpp", "uninstall_llama_cpp"]
