"""llama-server's `--models-preset FILE`: an INI file of the router's models, read as the pin's common/preset.cpp
reads it (what each key means for a model is the CLI's: cli/preset_specs.py).

    version = 1          ; skipped (reserved)
    [*]                  ; every preset's defaults (a preset's own keys win)
    c = 4096
    [my-model]           ; a model served under this id
    hf-repo = org/repo   ; keys: llama-server's flags without their dashes (long, short), or their LLAMA_ARG_* names
    dedup-cache-models = 1

The grammar is the pin's: `[name]` headers (a tag after the last ':' written upper case, as
"org/repo:q8_0" -> "org/repo:Q8_0"), `key = value` lines starting at the line's first column
(a key is [A-Za-z_][A-Za-z0-9_.-]*), `;` or `#` comments (a value ends at the first one, its trailing
blanks dropped), blank lines. Keys before any header belong to a preset named "default" (left
out, as an empty `[default]`, when it has none). A header given twice starts its section again; a
key given twice keeps its last value. What the pin refuses (a line of none of these kinds) is a
PresetError naming the file and line; the pin says only that the file did not parse.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..errors import InvalidParameterError
from .model_specs import ModelSpec

DEFAULT_NAME = "default"
GLOBAL_NAME = "*"

_HEADER = re.compile(r"\[[ \t]*([^\]]+)\][ \t]*(?:[;#].*)?")
_KEY_VALUE = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]*)[ \t]*=[ \t]*([^;#]*)(?:[;#].*)?")
_BLANK_OR_COMMENT = re.compile(r"[ \t]*(?:[;#].*)?")
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)

# The pin's truthy and falsey spellings (common_arg_utils::is_truthy / is_falsey).
TRUE = ("on", "enabled", "true", "1")
FALSE = ("off", "disabled", "false", "0")


class PresetError(InvalidParameterError):
    """A --models-preset file that cannot be served: the message names the file, and the line and key where one
    is at fault. Do: fix the file (GET /models?reload=1 reads it again)."""


@dataclasses.dataclass(frozen=True)
class Option:
    """One `key = value` line: the key as written, its value, its line number (1-based)."""

    key: str
    value: str
    line: int


@dataclasses.dataclass
class Section:
    """One preset: its name (the model's id), its options by key as written, the line of its header (0: the keys
    before any header)."""

    name: str
    line: int
    options: dict[str, Option] = dataclasses.field(default_factory=dict)

    def where(self, path: Path, option: Option | None = None) -> str:
        """"FILE line N [name]" for errors: the option's line, else the header's."""
        line = option.line if option is not None else self.line
        return f"{path} line {line} [{self.name}]" if line else f"{path} [{self.name}]"


def canonical_name(name: str) -> str:
    """A section's name with the tag after its last ':' as the pin writes it ("org/repo:q8_0" -> "org/repo:Q8_0",
    "org/repo:UD-q4_k_xl" -> "org/repo:Q4_K_XL"): the id a cached model of that tag has."""
    if name in (GLOBAL_NAME, DEFAULT_NAME) or ":" not in name:
        return name
    head, _, tag = name.rpartition(":")
    found = _TAG.search(tag)
    return f"{head}:{(found.group(1) if found else tag).upper()}"


def is_truthy(value: str) -> bool:
    return value.strip().lower() in TRUE


def read_ini(path: str | Path) -> tuple[Section | None, dict[str, Section]]:
    """(the `[*]` section or None, the presets by name) of the INI file `path`."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise PresetError(f"--models-preset {path}: preset file does not exist", field="models_preset") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PresetError(f"--models-preset {path}: cannot be read ({exc})", field="models_preset") from None
    sections: dict[str, Section] = {}
    current = Section(DEFAULT_NAME, 0)
    sections[DEFAULT_NAME] = current
    for number, line in enumerate(re.split(r"\r\n|\n|\r", text), start=1):
        header = _HEADER.fullmatch(line)
        if header is not None:
            name = canonical_name(header.group(1).strip())
            current = sections[name] = Section(name, number)  # (a header given again starts its section again)
            continue
        pair = _KEY_VALUE.fullmatch(line)
        if pair is not None:
            key = pair.group(1)
            if key != "version":  # reserved by the pin for later use
                current.options[key] = Option(key, pair.group(2).rstrip(" \t"), number)
            continue
        if _BLANK_OR_COMMENT.fullmatch(line) is None:
            raise PresetError(f"{path} line {number}: not a [section], a key = value line (the key at the line's "
                              f"start), a comment or a blank line: {line.strip()[:80]!r}", field="models_preset")
    if not sections[DEFAULT_NAME].options:  # (the pin leaves out an empty "default", headed or not)
        del sections[DEFAULT_NAME]
    return sections.pop(GLOBAL_NAME, None), sections


@dataclasses.dataclass(frozen=True)
class PresetModels:
    """What a --models-preset file serves (cli/preset_specs.py builds it): its models, the ids of the command
    line's models its `dedup-cache-models` hides from GET /models, and the ids to load at the start
    (`load-on-startup`)."""

    specs: tuple[ModelSpec, ...]
    hidden: frozenset[str] = frozenset()
    startup: tuple[str, ...] = ()
