"""GBNF rule bodies as text: a body's tokens, parsed into alternatives and rendered back, and its literals.

A forced tool call (tool_choice.py, tool_args.py) edits llama.cpp's chat-layer grammar as text, rule by rule:
`line.partition(" ::= ")`, then the body's tokens (TOKEN) or its alternatives (parse / render).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

# GBNF's tokens: a literal, a character class, a name, a {m,n} repetition, a token reference, any other mark.
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z0-9_-]+|\{[0-9, ]*\}|<\[\d+\]>|\S')
_OPS = ("?", "*", "+")

# A rule body as alternatives of sequences of items; an item is [token or alternatives, repetition or ""].
Alts = list[list[list[Any]]]


def parse(tokens: list[str], at: int = 0) -> tuple[Alts, int]:
    alts: Alts = [[]]
    while at < len(tokens):
        tok = tokens[at]
        if tok == ")":
            return alts, at + 1
        at += 1
        if tok == "|":
            alts.append([])
            continue
        item: list[Any] = [tok, ""]
        if tok == "(":
            item[0], at = parse(tokens, at)
        if at < len(tokens) and (tokens[at] in _OPS or tokens[at].startswith("{")):
            item[1] = tokens[at]
            at += 1
        alts[-1].append(item)
    return alts, at


def refers(alts: Alts, names: set[str]) -> bool:
    return any(item[0] in names if isinstance(item[0], str) else refers(item[0], names)
               for seq in alts for item in seq)


def render(alts: Alts) -> str:
    def item(tok: Any, rep: str) -> str:
        return (tok if isinstance(tok, str) else f"({render(tok)})") + rep

    return " | ".join(" ".join(item(tok, rep) for tok, rep in seq) for seq in alts)


def edit_bodies(lines: list[str], edit: Callable[[list[str]], list[str]]) -> list[str]:
    """`lines` with each rule's body, as tokens, put through `edit`; a rule whose tokens come back unchanged keeps
    its text as written."""
    out = []
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        if sep:
            tokens = TOKEN.findall(body)
            edited = edit(list(tokens))
            if edited != tokens:
                line = f"{name} ::= {' '.join(edited)}"
        out.append(line)
    return out


def gbnf_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def char_class(chars: str) -> str:
    return "".join("\\" + c if c in "]^-\\" else c for c in dict.fromkeys(chars))


def literal(token: str) -> str | None:
    """The text of a GBNF literal token (None: not a literal, or an escape JSON does not read)."""
    try:
        text = json.loads(token) if token.startswith('"') else None
    except ValueError:
        return None
    return text if isinstance(text, str) else None


def first_literal(alts: Alts) -> str | None:
    for seq in alts:
        for tok, _ in seq:
            found = tok if isinstance(tok, str) and tok.startswith('"') else None
            if found is None and not isinstance(tok, str):
                found = first_literal(tok)
            if found is not None:
                return found
        return None
    return None


def literals(alts: Alts) -> Iterator[str]:
    for seq in alts:
        for tok, _ in seq:
            if isinstance(tok, str):
                if tok.startswith('"'):
                    yield json.loads(tok)
            else:
                yield from literals(tok)
