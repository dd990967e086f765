"""Bounds on a GBNF grammar, checked in Python before llama.cpp's parser sees it.

llama.cpp's grammar parser recurses once per parenthesis (20,000 nested ones overflow the stack: SIGSEGV,
llama-server too); its left-recursion check, and the sampler at every token, recurse along chains of rules
that each begin with the next (20,000 of them overflow a 2 MiB thread stack); a `{m,n}` repetition copies the
item before it up to 2,000 times; and building and advancing the grammar's stacks takes time that grows with
the square of the alternatives live at once (20,000 in one rule: ~20 s of every slot). A scan of the text
(string and regular-expression operations, no parse) refuses, with an `InvalidGrammarError` naming the bound:

- more than MAX_BYTES of text;
- parentheses nested deeper than MAX_NESTING;
- more than MAX_RULES rules (llama.cpp makes one of each parenthesised group and each `*`, `+`, `?` too);
- more than MAX_ALTERNATIVES alternatives in one rule or group;
- a chain of rules, each beginning with the next, longer than MAX_CHAIN (counted high: a rule counts its
  parentheses' depth and its repetitions too);
- repetitions that copy more than MAX_REPEATED symbols (`"abc"{100}`: 300).

Each is far above what real grammars need: the pin's grammars/ and llama.cpp's JSON-schema converter's
output for 128 tools of 10 parameters each (880 KB, 20,000 rules) pass.
"""

from __future__ import annotations

import itertools
import re

from ..errors import InvalidGrammarError

MAX_BYTES = 4 << 20
MAX_NESTING = 128
MAX_RULES = 200_000
MAX_ALTERNATIVES = 4_096
MAX_CHAIN = 4_096
MAX_REPEATED = 1_000_000

# What is not syntax: comments, literals, character classes and tokens (each becomes a space).
_TEXT = re.compile(r"""\#[^\r\n]*|"(?:[^"\\]|\\.)*"?|\[(?:[^\]\\]|\\.)*\]?|!?<[^>]*>?""", re.DOTALL)
_RULE = re.compile(r"(?<![A-Za-z0-9_-])([A-Za-z0-9_-]+)\s*::=")  # from a name's start only: linear
_FIRST = re.compile(r"(?:^|[|(])\s*([A-Za-z0-9_-]+)")  # a name that begins an alternative
_PARENS = re.compile(r"[()]+")
_STEP = {"(": 1, ")": -1}
_INNERMOST = re.compile(r"\(([^()]*)\)")
# An item and its {m,n}: a literal, a class, or (from its start only, so linear) a name, `.` or `)`.
_REPEAT = re.compile(r"""("(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|(?<![A-Za-z0-9_.)-])[A-Za-z0-9_.)-]+)"""
                     r"""\s*\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}""")


def _refuse(what: str, bound: str) -> InvalidGrammarError:
    return InvalidGrammarError(f"the grammar {what} ({bound}: llamaplug's bound, so that llama.cpp's parser and "
                               "sampler stay within their stack and time)", reason=what)


def _depth(text: str) -> int:
    if "(" not in text:
        return 0
    parens = "".join(_PARENS.findall(text))
    return max(itertools.accumulate(map(_STEP.__getitem__, parens)))


def check_bounds(source: str) -> None:
    """Raise InvalidGrammarError where `source` passes one of the module's bounds (see its doc)."""
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise _refuse(f"is {size} bytes long", f"at most {MAX_BYTES} bytes")
    syntax = _TEXT.sub(" ", source)
    depth = _depth(syntax)
    if depth > MAX_NESTING:
        raise _refuse(f"nests parentheses deeper than {MAX_NESTING} levels", f"at most {MAX_NESTING} levels")
    rules = syntax.count("::=") + syntax.count("(") + syntax.count("*") + syntax.count("+") + syntax.count("?")
    if rules > MAX_RULES:
        raise _refuse(f"has more than {MAX_RULES} rules (a parenthesised group or a repetition is one)",
                      f"at most {MAX_RULES}")
    if syntax.count("|") > MAX_ALTERNATIVES:
        _check_alternatives(syntax)
    repetitions = syntax.count("*") + syntax.count("+") + syntax.count("?")
    if syntax.count("::=") * (1 + 2 * depth) + repetitions > MAX_CHAIN:  # else no chain can be longer
        _check_chains(syntax)
    if "{" in syntax:
        repeated = sum((len(item) - 2 if item[:1] in ('"', "[") else 1) * max(int(low or 0), int(high or 0))
                       for item, low, high in _REPEAT.findall(_TEXT.sub(_keep_text, source)))
        if repeated > MAX_REPEATED:
            raise _refuse(f"repeats items into more than {MAX_REPEATED} symbols", f"at most {MAX_REPEATED}")


def _keep_text(match: re.Match[str]) -> str:
    """Literals and classes as they are, comments and tokens as a space (for _REPEAT, which reads literals)."""
    return match.group() if match.group()[:1] in ('"', "[") else " "


def _check_alternatives(syntax: str) -> None:
    """The alternatives of each group (innermost first, each then taken out), then of each rule."""
    while True:
        groups = _INNERMOST.findall(syntax)
        if not groups:
            break
        if any(g.count("|") >= MAX_ALTERNATIVES for g in groups):
            break
        syntax = _INNERMOST.sub(" ", syntax)
    if any(b.count("|") >= MAX_ALTERNATIVES for b in groups or _RULE.split(syntax)[2::2]):
        raise _refuse(f"has more than {MAX_ALTERNATIVES} alternatives in one rule or group",
                      f"at most {MAX_ALTERNATIVES}")


def _check_chains(syntax: str) -> None:
    """The longest chain of rules each beginning with the next (what llama.cpp's recursions follow)."""
    parts = _RULE.split(syntax)
    begins: dict[str, list[str]] = {}
    weight: dict[str, int] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        begins.setdefault(name, []).extend(_FIRST.findall(body.strip()))
        # a rule's own levels: itself, its groups and its repetitions (each a rule in llama.cpp), counted high
        weight[name] = max(weight.get(name, 0), 1 + 2 * _depth(body) + body.count("*") + body.count("+")
                           + body.count("?"))
    longest: dict[str, int] = {}
    for start in begins:
        if start in longest:
            continue
        stack = [(start, iter(begins[start]))]
        on_path = {start}
        while stack:
            name, todo = stack[-1]
            nxt = next(todo, None)
            if nxt is None:
                stack.pop()
                on_path.discard(name)
                below = max((longest.get(n, 0) for n in begins[name] if n in begins and n not in on_path),
                            default=0)
                longest[name] = weight[name] + below
                if longest[name] > MAX_CHAIN:
                    raise _refuse(f"has a chain of rules, each beginning with the next, of more than {MAX_CHAIN} "
                                  "levels", f"at most {MAX_CHAIN}")
            elif nxt in begins and nxt not in longest and nxt not in on_path:
                stack.append((nxt, iter(begins[nxt])))
                on_path.add(nxt)
