"""The examples of README.md and docs/: found in their pages, and run as a reader would run them.

A page's ```python blocks run in order in one fresh interpreter and one namespace (a later block
uses what an earlier one made), in an empty working directory. A block the reader cannot run here
says why in the line before its fence, and is counted, not run:

    <!-- docs-test: skip (needs a GPU) -->

```console blocks are shell sessions: each `$ llamaplug ...` line runs (skipped the same way).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from .settings import REPO

FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\((?P<why>.+)\)\s*-->")
RUNNABLE = ("python", "console")


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip: str | None  # why it does not run here

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    def commands(self) -> list[str]:
        """A console block's commands: its `$ ` lines."""
        return [line[2:] for line in self.code.splitlines() if line.startswith("$ ")]


def pages() -> list[Path]:
    """README.md and every page of the site."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The fenced python and console blocks of `page`, dedented (a block may sit in a list item)."""
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m["lang"]:
            i += 1
            continue
        start, indent, lang = i, len(m["indent"]), m["lang"]
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        i += 1
        if lang in RUNNABLE:
            skip = SKIP.search(lines[start - 1]) if start else None
            found.append(Block(page, start + 1, lang, "\n".join(body) + "\n", skip["why"] if skip else None))
    return found


def page_program(page_blocks: list[Block]) -> str:
    """A Python program running the page's runnable python blocks in order, naming the block that fails."""
    runs = [(b.where, b.code) for b in page_blocks if b.lang == "python" and b.skip is None]
    return (
        "import sys, traceback\n"
        f"runs = {runs!r}\n"
        "ns = {'__name__': '__main__'}\n"
        "for where, code in runs:\n"
        "    try:\n"
        "        exec(compile(code, where, 'exec'), ns)\n"
        "    except BaseException:\n"
        "        traceback.print_exc()\n"
        "        print(f'EXAMPLE FAILED: {where}', file=sys.stderr)\n"
        "        sys.exit(1)\n"
    )
