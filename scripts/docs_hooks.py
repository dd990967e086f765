"""MkDocs hooks: pages that are generated from the code, so they cannot drift from it.

A page asks for a table with a marker on a line of its own:

    <!-- generated: params LlamaParams -->   every field: name, type, default, meaning
                                             (a field without a description fails the build)
    <!-- generated: errors -->               every LlamaError subclass: base, when it is raised, what to do
    <!-- generated: kv_cache_types -->       every KvCacheType: ggml type id, memory relative to F16

They import the installed llamaplug (`make docs` runs in the dev venv).
"""

from __future__ import annotations

import enum
import inspect
import re
import typing
from typing import Any

MARKER = re.compile(r"^<!-- generated: (?P<what>\w+)(?: (?P<arg>\w+))? -->$", re.MULTILINE)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return MARKER.sub(lambda m: GENERATORS[m["what"]](m["arg"]), markdown)


def params_table(name: str | None) -> str:
    from llamaplug import params

    cls = getattr(params, name or "")
    undocumented = [field for field, info in cls.model_fields.items() if not (info.description or "").strip()]
    if undocumented:
        # The page is the reference for every field: a field without a meaning fails the build, not the reader.
        raise ValueError(f"{cls.__name__} fields without a description (add Field(..., description=...) in "
                         f"llamaplug/params.py): {', '.join(undocumented)}")
    rows = ["| field | type, default | meaning |", "|---|---|---|"]
    for field, info in cls.model_fields.items():
        default = "required" if info.is_required() else _default(info)
        meaning = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{field}` | {_type(info.annotation)}<br>= {default} | {meaning} |")
    return "\n".join(rows)


def errors_table(_: str | None) -> str:
    from llamaplug import errors

    classes = [c for c in vars(errors).values()
               if inspect.isclass(c) and issubclass(c, errors.LlamaError)]
    classes.sort(key=lambda c: (c is not errors.LlamaError, c.__name__))  # the base, then A to Z
    undocumented = [c.__name__ for c in classes if not (c.__dict__.get("__doc__") or "").strip()]
    if undocumented:  # inspect.getdoc would show the base's docstring: say it instead
        raise ValueError(f"errors without their own docstring in llamaplug/errors.py: {', '.join(undocumented)}")
    # A section per error (not a table: the class names would wrap), so each has an anchor: errors.md#decodeerror.
    sections = []
    for c in classes:
        base = ", ".join(f"`{b.__name__}`" for b in c.__bases__)
        doc = " ".join((inspect.getdoc(c) or "").split())
        what, _, todo = doc.partition(" Do: ")
        todo = f"\n\n**What to do:** {todo}" if todo else ""
        sections.append(f"## {c.__name__}\n\n*Subclass of {base}.* {what}{todo}")
    return "\n\n".join(sections)


def kv_cache_types_table(_: str | None) -> str:
    from llamaplug.params import KvCacheType

    rows = ["| `KvCacheType` | ggml type id | memory vs. F16 |", "|---|---|---|"]
    for kind in KvCacheType:
        rows.append(f"| `{kind.name}` | {kind.value} | {kind.memory_factor:.0%} |")
    return "\n".join(rows)


def _default(info: Any) -> str:
    if info.default_factory is not None:
        name = getattr(info.default_factory, "__name__", "")
        return f"`{name}()`" if name and name != "<lambda>" else f"`{info.default_factory()!r}`"
    value = info.default
    if isinstance(value, enum.Enum):
        return f"`{value.name}`"
    return f"`{value!r}`"


def _type(annotation: Any) -> str:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return f"`{annotation.__name__}`"
    text = re.sub(r"\b(typing|pathlib|llamaplug\.params|collections\.abc)\.", "", str(annotation))
    # A "|" inside a code span would end the table cell, and an escaped one shows its backslash: say "or".
    return " or ".join(f"`{part.strip()}`" for part in _top_level_union(text))


def _top_level_union(text: str) -> list[str]:
    """`a | b[c | d]` -> ["a", "b[c | d]"]: the union's members, not the pipes inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


GENERATORS = {"params": params_table, "errors": errors_table, "kv_cache_types": kv_cache_types_table}
