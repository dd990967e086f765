#!/usr/bin/env python3
"""Write docs/chat.md's table of supported templates from tests/test_chat_templates.py's results.

    python scripts/chat_families.py            # rewrites the table between its markers
    python scripts/chat_families.py --check    # exit 1 when the page's table is not the current one

Every template of the pin's models/templates/ has its prompt (with tools) checked against llama-server; a
template has its tool calls checked (whole and streamed, against llama.cpp's parser) unless the test's
NO_ROUND_TRIP lists it, with the reference program's reason; TEST_CHAT_CASES's on test-chat.cpp's reply.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "vendor" / "llama.cpp")]

BEGIN, END = "<!-- chat-families: begin -->", "<!-- chat-families: end -->"


def table() -> str:
    import fetch

    names = sorted(p.name for p in (fetch.materialise() / "models" / "templates").glob("*.jinja"))
    text = (REPO / "tests" / "test_chat_templates.py").read_text()
    scope: dict = {}
    start = text.index("NOT_CONTINUED = ")
    exec(text[start:text.index("}\n", start) + 2], scope)  # noqa: S102 - the test's own constants
    excluded = scope["NO_ROUND_TRIP"]
    start = text.index("TEST_CHAT_CASES = ")
    exec(text[start:text.index("}\n", start) + 2], scope)  # noqa: S102
    given = scope["TEST_CHAT_CASES"]
    rows = ["| template (the pin's models/templates/) | prompt = llama-server's | tool calls = llama.cpp's parser |",
            "|---|---|---|"]
    for name in names:
        why = excluded.get(name)
        calls = "yes, whole and streamed" if why is None else f"not checked: {why}"
        if name in given:
            calls = "yes, whole and streamed (on the reply of the pin's tests/test-chat.cpp)"
        rows.append(f"| {name.removesuffix('.jinja')} | yes | {calls} |")
    checked = len(names) - len(excluded)
    return "\n".join([BEGIN, f"{len(names)} templates; tool calls checked on {checked}.", "", *rows, END])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    page = REPO / "docs" / "chat.md"
    text = page.read_text()
    new = text[:text.index(BEGIN)] + table() + text[text.index(END) + len(END):]
    if args.check:
        return 0 if new == text else 1
    page.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
