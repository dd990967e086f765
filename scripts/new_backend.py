#!/usr/bin/env python3
"""Make a new backend plugin from plugins/_template: `scripts/new_backend.py NAME OPTION [--what TEXT]`.

NAME is the plugin's short name (plugins/backend_NAME, llamaplug-backend-NAME, llamaplug_backend_NAME);
OPTION the GGML_<OPTION> switch of ggml's CMake that builds the module (SYCL builds ggml-sycl). For example

    scripts/new_backend.py sycl SYCL --what "ggml's SYCL backend (Intel GPUs)"

writes plugins/backend_sycl/: pyproject.toml, CMakeLists.txt, README.md, the package (registration and a
probe skeleton) and the probe's test. The template's files end in .tmpl, so that no tool takes them for the
real thing (pytest, ruff, pip); `{{key}}` in a file or a path is one of NAME, OPTION, the module and the
description. tests/test_backend_template.py renders the template for the existing backends and compares.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "plugins" / "_template"
SUFFIX = ".tmpl"
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def values(name: str, option: str, *, what: str | None = None, module: str | None = None) -> dict[str, str]:
    """The placeholders' values: name, option, module (ggml-<module>) and what (the one-line description)."""
    if not re.fullmatch(r"[a-z][a-z0-9]*", name):
        raise ValueError(f"NAME {name!r}: lower-case letters and digits, starting with a letter (e.g. sycl)")
    if not re.fullmatch(r"[A-Z][A-Z0-9_]*", option):
        raise ValueError(f"OPTION {option!r}: the upper-case GGML_<OPTION> of ggml's CMake (e.g. SYCL)")
    return {"name": name, "option": option, "module": module or option.lower(),
            "what": what or f"ggml's {option} backend"}


def fill(text: str, keys: dict[str, str], where: str) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(1) not in keys:
            raise KeyError(f"{where}: unknown placeholder {match.group(0)} (known: {', '.join(sorted(keys))})")
        return keys[match.group(1)]

    return _PLACEHOLDER.sub(one, text)


def render(keys: dict[str, str], template: Path = TEMPLATE) -> dict[Path, str]:
    """{path inside the new plugin folder: text} for every file of the template."""
    out: dict[Path, str] = {}
    for source in sorted(template.rglob(f"*{SUFFIX}")):
        relative = source.relative_to(template).as_posix()
        path = Path(fill(relative.removesuffix(SUFFIX), keys, relative))
        out[path] = fill(source.read_text(), keys, relative)
    return out


def write(keys: dict[str, str], plugins: Path = REPO / "plugins") -> Path:
    """Render into plugins/backend_<name>/, which must not exist yet; returns that folder."""
    folder = plugins / f"backend_{keys['name']}"
    if folder.exists():
        raise FileExistsError(f"{folder} exists: pick another NAME or remove it first")
    for path, text in render(keys).items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="short name: plugins/backend_NAME (lower case, e.g. sycl)")
    parser.add_argument("option", help="ggml's CMake switch GGML_<OPTION> that builds the module (e.g. SYCL)")
    parser.add_argument("--what", help="one-line description (default: \"ggml's OPTION backend\")")
    parser.add_argument("--module", help="the module's name after ggml- (default: OPTION in lower case)")
    parser.add_argument("--plugins", type=Path, default=REPO / "plugins", help="where to write (default: plugins/)")
    args = parser.parse_args(argv)
    try:
        folder = write(values(args.name, args.option, what=args.what, module=args.module), args.plugins)
    except (ValueError, KeyError, FileExistsError) as exc:
        print(f"new_backend: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {folder}: write its probe (probe.py) and the decision table of its test; then add it to the "
          "README's backend matrix and layout, and a [testenv:backend_<name>] to tox.ini")
    return 0


if __name__ == "__main__":
    sys.exit(main())
