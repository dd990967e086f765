"""The chat layer's PEG parser as llama.cpp serializes it (params["parser"]): its parsers, and what they tag.

The grammar llama.cpp builds for a reply comes from this parser, and its GBNF rules are named after the
parser's ids (`until-<id>`, `ac-<id>`) or after the parser's rules: reading the arena says which rules of the
grammar are content, a call, a function's name or an argument's value (tool_choice.py, tool_args.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def _children(node: dict[str, Any]) -> list[int]:
    if "children" in node:
        return list(node["children"])
    return [node["child"]] if "child" in node and node["type"] != "rule" else []


def walk(arena: dict[str, Any], start: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """The parsers under `start`, not entering rules (a rule is named in the grammar by itself)."""
    parsers, todo, seen = arena["parsers"], [start], set()
    while todo:
        at = todo.pop()
        if at in seen:
            continue
        seen.add(at)
        node = parsers[at]
        yield at, node
        todo.extend(_children(node))


def _names_under(arena: dict[str, Any], start: int) -> set[str]:
    names = set()
    for at, node in walk(arena, start):
        if node["type"] in ("until", "ac"):
            names.add(f"{node['type']}-{at}")
        elif node["type"] in ("rule", "ref"):
            names.add(node["name"])
    return names


def content_names(arena: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The grammar names of what the parser tags content and nothing else, and of what it tags reasoning."""
    content: set[str] = set()
    reasoning: set[str] = set()
    for node in arena["parsers"]:
        if node["type"] == "tag" and node["tag"] in ("content", "reasoning"):
            (content if node["tag"] == "content" else reasoning).update(_names_under(arena, node["child"]))
    shared = content & reasoning
    if shared:
        # one message rule tagged content in one place and reasoning in another (gpt-oss's message-content, in its
        # "preamble" and its "analysis"): the rule that tags it content and holds nothing else tagged is content
        for node in arena["parsers"]:
            if node["type"] == "rule":
                tags = [n for _, n in walk(arena, node["child"]) if n["type"] == "tag"]
                if tags and all(t["tag"] == "content" and _names_under(arena, t["child"]) <= shared for t in tags):
                    content.add(node["name"])
    return content - reasoning, reasoning


def call_rules(arena: dict[str, Any]) -> set[str]:
    """The names of the rules a lazy grammar would start at (the parser's trigger rules: the calls)."""
    return {node["name"] for node in arena["parsers"] if node["type"] == "rule" and node.get("trigger")}


def lookahead_end(arena: dict[str, Any], at: int) -> str | None:
    """The literal a parser ends by looking ahead at (GLM's function: `... &"</tool_call>"`), or None."""
    parsers = arena["parsers"]
    for _ in range(8):
        node = parsers[at]
        if node["type"] == "sequence" and node["children"]:
            at = node["children"][-1]
        elif node["type"] in ("atomic", "tag"):
            at = node["child"]
        elif node["type"] == "and":
            inner = parsers[node["child"]]
            return str(inner["literal"]) if inner["type"] == "literal" and inner["literal"].strip() else None
        else:
            return None
    return None


def tagged_literal(arena: dict[str, Any], nodes: list[tuple[int, dict[str, Any]]], tag: str) -> str | None:
    for _, node in nodes:
        if node["type"] == "tag" and node["tag"] == tag:
            for _, inner in walk(arena, node["child"]):
                if inner["type"] == "literal":
                    return str(inner["literal"])
    return None


def rules_reached(arena: dict[str, Any], start: int, rules: dict[str, int]) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for _, node in walk(arena, todo.pop()):
            if node["type"] in ("rule", "ref") and node["name"] not in seen:
                seen.add(node["name"])
                if node["name"] in rules:
                    todo.append(arena["parsers"][rules[node["name"]]]["child"])
    return seen


def value_token(arena: dict[str, Any], start: int, rules: dict[str, int], depth: int = 0
                 ) -> tuple[str, str, str] | None:
    """(the grammar token of the raw-text value under `start`, the delimiter it includes or "", the delimiter that
    ends it): an `until-N` (the close follows it in the grammar), an `ac-N` (it holds the close) or the rule holding
    one of those."""
    parsers = arena["parsers"]
    for at, node in walk(arena, start):
        if node["type"] == "tag" and node["tag"] == "tool-arg-string-value" \
                and parsers[node["child"]]["type"] == "until":
            return f"until-{node['child']}", "", parsers[node["child"]]["delimiters"][0]
        if node["type"] == "ac" and any(n["type"] == "tag" and n["tag"] == "tool-arg-string-value"
                                        for _, n in walk(arena, node["child"])):
            return f"ac-{at}", node["delimiters"][0], node["delimiters"][0]
        if node["type"] in ("rule", "ref") and depth < 2 and node["name"] in rules:
            held = parsers[rules[node["name"]]]["child"]
            inner = value_token(arena, held, rules, depth + 1)
            if inner is not None:
                _, close, ends = inner
                if not close and any(n["type"] == "literal" and n["literal"] == ends for _, n in walk(arena, held)):
                    # the rule holds the close after its until (Ling 3's `ling3-arg-string ::= until-N
                    # "</arg_value>"`): a value put in the rule's place must end with it, or the call goes on
                    # without it and the parser reads the rest of the reply as the value
                    close = ends
                return node["name"], close, ends
    return None


def function_rules(arena: dict[str, Any]) -> dict[str, str]:
    """{a rule that names exactly one function: that function's name}."""
    functions = {}
    for node in arena["parsers"]:
        if node["type"] == "rule":
            found = {tagged_literal(arena, [(at, n)], "tool-name") for at, n in walk(arena, node["child"])} - {None}
            if len(found) == 1:
                functions[node["name"]] = found.pop()
    return functions
