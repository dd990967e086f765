"""A package's names imported when first asked for (PEP 562), for `llamaplug` and the plugin packages.

The plugin manager imports every plugin package in every llamaplug process, and `import llamaplug` comes
first in all of them: names that cost pydantic, numpy or a native library wait until something uses them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, homes: dict[str, tuple[str, ...]],
               namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`: each name in `homes[module]` comes from that module (relative
    to the package) the first time it is asked for, and is kept in the package's `namespace` from then on."""
    home = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(home))

    return __getattr__, __dir__
