"""A forced tool call that is a call: the chat layer's grammar for tool_choice "required", with no text before it.

llama.cpp's chat layer (so llama-server) builds the grammar of a "required" reply from the same PEG
parser that reads it: the thinking block, then any content up to the tool-call marker, then the call(s).
A model that does not start a call by itself writes that content until max_tokens, and no call comes.
Here the content parts are taken out of the grammar (never out of the parser that reads the reply):

    params = templates.apply({..., "tool_choice": "required"})
    params["grammar"] = call_first(params, parallel=False)

What is content is what the parser tags "content" (its serialized arena, params["parser"]); its GBNF
rules are named after the parser's id (`until-<id>`, `ac-<id>`) or are the rule it refers to. What the
parser also tags "reasoning" stays (gpt-oss shares one message rule), and so does the thinking block.
`parallel=False` makes the one-or-more call list of the JSON-native formats one call (the tagged formats'
grammars already follow parallel_tool_calls); a named tool_choice comes here as "required" over that tool with
parallel_tool_calls false (high/chat_plan.py), so it is one call whatever the request says, as OpenAI's contract.
A call's id (string or number, Kimi-K2's index) is bounded to 16
characters, and a
raw-text string argument (the XML-style formats) opens no markup and keeps its maxLength (_bound_strings); a
python-style call (LFM2) names each argument once (_args_once); a Gemma 4 call's dict is its schema's (_gemma4_args).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import InvalidGrammarError
from .grammar import check_grammar

_log = logging.getLogger("llamaplug.tool_choice")

# GBNF's tokens: a literal, a character class, a name, a {m,n} repetition, a token reference, any other mark.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z0-9_-]+|\{[0-9, ]*\}|<\[\d+\]>|\S')
_OPS = ("?", "*", "+")
# The call's id (the parser's tool-id: Mistral's "id", Cohere's "tool_call_id"), a string or number the grammar leaves
# unbounded: a model that does not end it (SmolLM2 writes digits) spends max_tokens inside a call never finished.
_ID = r'("\"" ( [^"\\] | "\\" ( ["\\/ bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\"" | json-number)'
# Kimi-K2's call id is "functions.<name>:<index>", the index any number of digits: SmolLM2 wrote digits until
# max_tokens.
_INDEX = '":" [0-9]+'
_BOUNDED_INDEX = '":" [0-9]{1,16}'
_BOUNDED_ID = r'("\"" ( [^"\\] | "\\" ( ["\\/ bfnrt] | "u" [0-9a-fA-F]{4} ) ){0,16} "\"" | "-"? [0-9]{1,16})'


def call_first(params: dict[str, Any], parallel: bool | None = None, tools: list[dict[str, Any]] | None = None
               ) -> str:
    """The grammar of `params` (a "required" reply's, from ChatTemplates.apply) without the content before, between
    or after the calls, and with `tools`' raw-text string arguments bounded (_bound_strings); the grammar as given
    where the parser tags no content the grammar names, or the result does not parse (logged); and as given where
    reasoning_format "none" makes the thinking block the template's generation prompt opens content."""
    grammar = params.get("grammar") or ""
    if not grammar or params.get("grammar_lazy"):
        return grammar
    start = params.get("thinking_start_tag") or ""
    if params.get("reasoning_format") == "none" and start and start in (params.get("generation_prompt") or ""):
        # With no reasoning format the thinking the prompt opens is content: the grammar must take it.
        return grammar
    try:
        arena = json.loads(params["parser"]) if isinstance(params.get("parser"), str) else params.get("parser")
        content, reasoning = _content_names(arena)
    except (KeyError, TypeError, ValueError, IndexError):
        return grammar
    lines = []
    for line in grammar.splitlines():
        name, sep, body = line.partition(" ::= ")
        if sep and body:
            body = _without(body, content, reasoning)
            if parallel is False:
                body = _one_call(body, _call_rules(arena))
            body = body.replace(_ID, _BOUNDED_ID).replace(_INDEX, _BOUNDED_INDEX)
            line = f"{name} ::= {body}"
        lines.append(line)
    lines = _one_thinking(lines, reasoning, _call_rules(arena) | {"tool-call"})
    lines = _no_space_before_lookahead(lines, arena)
    lines = _named_recipient(lines, arena)
    if parallel is False:
        lines = _one_function(lines, arena)
    lines = _gemma4_args(_args_once(_bound_strings(lines, arena, tools), arena, tools), tools)
    lines = _tagged_args_once(lines, arena, tools)
    lines = _bound_inline_strings(lines, arena, tools)
    out = "\n".join(lines) + ("\n" if grammar.endswith("\n") else "")
    if out == grammar:
        return grammar
    try:
        check_grammar(out)
    except InvalidGrammarError as exc:  # a shape this rewrite does not know: llama.cpp's grammar as it is
        _log.warning("the forced tool call's grammar could not drop its content (%s); using llama.cpp's", exc)
        return grammar
    return out


def tag_as_tokens(grammar: str, tag: str, tokens: list[int]) -> str:
    """`grammar` with each literal `tag` (the thinking start tag) written as the token ids `tokens`.

    A reasoning budget (llama.cpp's, as llama-server's) starts counting when it sees the tag's own tokens. Where the
    tag is text to the model, the grammar takes any spelling of it: SmolLM2 wrote gpt-oss's
    "<|channel|>analysis<|message|>" as "<|c ha nn e l|>..." (MiniMax-M3's "<mm:think>" likewise), the budget never
    started and the thinking went on until max_tokens. With the tag as those tokens the budget ends it."""
    if not tag or not tokens:
        return grammar
    refs = " ".join(f"<[{t}]>" for t in tokens)
    lines = []
    for line in grammar.splitlines():
        name, sep, body = line.partition(" ::= ")
        if sep and tag in body:
            parts = []
            for tok in _TOKEN.findall(body):
                try:
                    text = json.loads(tok) if tok.startswith('"') else None
                except ValueError:  # a GBNF escape JSON does not read (\x..): left as written
                    text = None
                if isinstance(text, str) and tag in text:
                    pieces = text.split(tag)
                    out = [_gbnf_literal(pieces[0])] if pieces[0] else []
                    for piece in pieces[1:]:
                        out += [refs] + ([_gbnf_literal(piece)] if piece else [])
                    tok = f"({' '.join(out)})"
                parts.append(tok)
            line = f"{name} ::= {' '.join(parts)}"
        lines.append(line)
    return "\n".join(lines) + ("\n" if grammar.endswith("\n") else "")


def _children(node: dict[str, Any]) -> list[int]:
    if "children" in node:
        return list(node["children"])
    return [node["child"]] if "child" in node and node["type"] != "rule" else []


def _walk(arena: dict[str, Any], start: int) -> Iterator[tuple[int, dict[str, Any]]]:
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
    for at, node in _walk(arena, start):
        if node["type"] in ("until", "ac"):
            names.add(f"{node['type']}-{at}")
        elif node["type"] in ("rule", "ref"):
            names.add(node["name"])
    return names


def _content_names(arena: dict[str, Any]) -> tuple[set[str], set[str]]:
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
                tags = [n for _, n in _walk(arena, node["child"]) if n["type"] == "tag"]
                if tags and all(t["tag"] == "content" and _names_under(arena, t["child"]) <= shared for t in tags):
                    content.add(node["name"])
    return content - reasoning, reasoning


def _call_rules(arena: dict[str, Any]) -> set[str]:
    """The names of the rules a lazy grammar would start at (the parser's trigger rules: the calls)."""
    return {node["name"] for node in arena["parsers"] if node["type"] == "rule" and node.get("trigger")}


# A rule body as alternatives of sequences of items; an item is [token or alternatives, repetition or ""].
Alts = list[list[list[Any]]]


def _parse(tokens: list[str], at: int = 0) -> tuple[Alts, int]:
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
            item[0], at = _parse(tokens, at)
        if at < len(tokens) and (tokens[at] in _OPS or tokens[at].startswith("{")):
            item[1] = tokens[at]
            at += 1
        alts[-1].append(item)
    return alts, at


def _refers(alts: Alts, names: set[str]) -> bool:
    return any(item[0] in names if isinstance(item[0], str) else _refers(item[0], names)
               for seq in alts for item in seq)


def _drop(alts: Alts, content: set[str], reasoning: set[str]) -> tuple[Alts, bool]:
    """`alts` without the references to `content`, the groups that leaves empty, and, in a choice, the
    alternatives that lost content and hold no thinking when another lost nothing (functionary v3.2's
    `"all\\n" <content> <call> | <calls>`: its first branch would be the call's name read as content)."""
    out: Alts = []
    lost: list[bool] = []
    for seq in alts:
        kept: list[list[Any]] = []
        dropped = False
        for tok, rep in seq:
            if isinstance(tok, str):
                if tok in content:
                    dropped = True
                else:
                    kept.append([tok, rep])
                continue
            inner, inner_dropped = _drop(tok, content, reasoning)
            dropped |= inner_dropped
            if any(inner):
                kept.append([inner, rep])
        out.append(kept)
        lost.append(dropped)
    if len(out) > 1 and any(lost) and not all(lost):
        out = [seq for seq, was in zip(out, lost) if not was or _refers([seq], reasoning)]
    return out, any(lost)


def _render(alts: Alts) -> str:
    def item(tok: Any, rep: str) -> str:
        return (tok if isinstance(tok, str) else f"({_render(tok)})") + rep

    return " | ".join(" ".join(item(tok, rep) for tok, rep in seq) for seq in alts)


def _without(body: str, content: set[str], reasoning: set[str]) -> str:
    """`body` without its content (see _drop); as given when it names none."""
    tokens = _TOKEN.findall(body)
    if not content.intersection(tokens):
        return body
    alts, _ = _parse(tokens)
    return _render(_drop(alts, content, reasoning)[0])


def _reaching(bodies: dict[str, list[str]], targets: set[str]) -> set[str]:
    """The rules of `bodies` ({name: its tokens}) that refer to `targets`, directly or through other rules."""
    found = set(targets)
    grew = True
    while grew:
        grew = False
        for name, tokens in bodies.items():
            if name not in found and found.intersection(tokens):
                found.add(name)
                grew = True
    return found


def _one_thinking(lines: list[str], reasoning: set[str], calls: set[str]) -> list[str]:
    """`lines` with a repeated group that reaches thinking and no call (gpt-oss's `(start any)* start tool-call`,
    `any` its analysis once its preamble is gone) taken at most once: SmolLM2 wrote one analysis block after another
    and the call never came, the reasoning budget ending each."""
    bodies = {}
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        if sep:
            bodies[name] = _TOKEN.findall(body)
    thinking, calling = _reaching(bodies, reasoning), _reaching(bodies, calls)

    def once(alts: Alts) -> bool:
        changed = False
        for seq in alts:
            for item in seq:
                if isinstance(item[0], str):
                    continue
                if item[1] == "*" and _refers(item[0], thinking) and not _refers(item[0], calling):
                    item[1] = "?"
                    changed = True
                else:
                    changed |= once(item[0])
        return changed

    out = []
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        if sep and "*" in body and thinking.intersection(bodies[name]):
            alts, _ = _parse(bodies[name])
            if once(alts):
                line = f"{name} ::= {_render(alts)}"
        out.append(line)
    return out


def _lookahead_end(arena: dict[str, Any], at: int) -> str | None:
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


def _no_space_before_lookahead(lines: list[str], arena: dict[str, Any]) -> list[str]:
    """`lines` without the `space` between a rule whose parser ends by looking ahead at a literal and that literal.
    llama.cpp writes no lookahead into GBNF: GLM's `tool-call ::= "<tool_call>" space (tool-get-time) space
    "</tool_call>"` takes whitespace before the close that the parser's `tool-get-time` (`... &"</tool_call>"`)
    refuses, and SmolLM2 wrote it: the reply was an error ("does not match the expected format")."""
    ends = {}
    for node in arena["parsers"]:
        if node["type"] == "rule":
            end = _lookahead_end(arena, node["child"])
            if end is not None:
                ends[node["name"]] = _gbnf_literal(end)
    if not ends:
        return lines

    def edit(tokens: list[str]) -> list[str]:
        keep: list[str] = []
        for i, tok in enumerate(tokens):
            if tok == "space" and 0 < i < len(tokens) - 1 and keep:
                before = keep[-1]
                if before == ")":  # the group just closed: each name in it must end by looking ahead at the literal
                    depth, j = 0, len(keep) - 1
                    while j >= 0:
                        depth += {")": 1, "(": -1}.get(keep[j], 0)
                        if depth == 0:
                            break
                        j -= 1
                    names = [t for t in keep[j + 1:-1] if t not in ("|", "(", ")")]
                else:
                    names = [before]
                if names and all(ends.get(n) == tokens[i + 1] for n in names):
                    continue
            keep.append(tok)
        return keep

    return _edit_bodies(lines, edit)


def _edit_bodies(lines: list[str], edit: Callable[[list[str]], list[str]]) -> list[str]:
    """`lines` with each rule's body, as tokens, put through `edit`; a rule whose tokens come back unchanged keeps
    its text as written."""
    out = []
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        if sep:
            tokens = _TOKEN.findall(body)
            edited = edit(list(tokens))
            if edited != tokens:
                line = f"{name} ::= {' '.join(edited)}"
        out.append(line)
    return out


def _named_recipient(lines: list[str], arena: dict[str, Any]) -> list[str]:
    """`lines` with a call's free-text recipient (muse-glimmer's `" to=" <until "<|message|>">`, the function read from
    the call's own markup) as the function's name, as the template writes it (`to=get_time`): SmolLM2 wrote a
    recipient until max_tokens."""
    parsers = arena["parsers"]
    names = {}
    for node in parsers:
        if node["type"] == "tag" and node["tag"] == "tool-open":
            inside = list(_walk(arena, node["child"]))
            function = _tagged_literal(arena, inside, "tool-name")
            for _, seq in inside:
                kids = seq.get("children", []) if seq["type"] == "sequence" else []
                for before, after in zip(kids, kids[1:]):
                    if parsers[before]["type"] == "literal" and parsers[before]["literal"].strip() == "to=" \
                            and parsers[after]["type"] == "until" and function:
                        names[f"until-{after}"] = _gbnf_literal(function)
    if not names:
        return lines

    def edit(tokens: list[str]) -> list[str]:
        for i, tok in enumerate(tokens):
            # the recipient of this rule's function only (its name is in the rule)
            if tok in names and i > 0 and tokens[i - 1] == '" to="' and names[tok] in tokens:
                tokens[i] = names[tok]
        return tokens

    return _edit_bodies(lines, edit)


_FUNCTION_LIST = re.compile(r"(\([A-Za-z0-9_| -]+\))\s*\+")


def _one_function(lines: list[str], arena: dict[str, Any]) -> list[str]:
    """`lines` with a list of functions `(fn-a | fn-b)+` (Kimi-K3's, whatever parallel_tool_calls says) as one: SmolLM2
    wrote two calls with parallel_tool_calls false."""
    functions = set()
    for node in arena["parsers"]:
        if node["type"] == "rule":
            found = {_tagged_literal(arena, [(at, n)], "tool-name") for at, n in _walk(arena, node["child"])} - {None}
            if len(found) == 1:
                functions.add(node["name"])

    def one(match: re.Match[str]) -> str:
        return match.group(1) if set(re.split(r"\s*\|\s*", match.group(1)[1:-1].strip())) <= functions \
            else match.group(0)

    out = []
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        if sep and ")+" in body.replace(" ", ""):
            line = f"{name} ::= {_FUNCTION_LIST.sub(one, body)}"
        out.append(line)
    return out


def _one_call(body: str, calls: set[str]) -> str:
    """`(call space)+` (the JSON-native formats' call list, whatever parallel_tool_calls says) as one call."""
    tokens = _TOKEN.findall(body)
    if len(tokens) == 5 and tokens[0] == "(" and tokens[1] in calls | {"tool-call"} and tokens[2] == "space" \
            and tokens[3] == ")" and tokens[4] == "+":
        return f"{tokens[1]} space"
    return body


# A raw-text string argument (the XML-style formats: Qwen3-Coder's `<parameter=zone>\n...\n</parameter>`, Seed-OSS,
# MiniMax, DeepSeek's DSML, Kimi-K3, Spark) is an `until`: any text up to the closing markup, maxLength ignored. A model
# that writes a tag there first ("UTC</parameter>" without the newline the close needs, or the schema's own "<type>")
# is held inside the value, and the markup becomes the argument. In a forced call such a value opens no markup ("<"
# is followed by whitespace only, as in "a < b": SmolLM2 also wrote "<#1>"), does not begin the closing markup (its
# first two characters: MiniMax-M3's "]<"), and holds at most the schema's maxLength characters (counted up to
# _MAX_COUNTED; unbounded beyond), and begins with neither whitespace nor "<" ("\n\n", "< type=date>": SmolLM2), so
# the model must close it the template's way. A valid call looks as before; only
# values with such markup can no longer be written.
_TAG_START = "<"
_MAX_COUNTED = 256


def _string_values(arena: dict[str, Any]) -> dict[str, tuple[str, str, str, str, str]]:
    """{the grammar rule of one argument: (function, parameter, the rule's token for the raw-text value, the closing
    delimiter that token includes or "", the delimiter that ends the value)}, for each argument whose value the
    parser reads as raw text."""
    parsers, rules = arena["parsers"], arena.get("rules", {})
    args: dict[str, tuple[str, str, str, str, str]] = {}
    for node in parsers:
        if node["type"] != "rule":
            continue
        inside = list(_walk(arena, node["child"]))
        if sum(n["type"] == "tag" and n["tag"] == "tool-arg" for _, n in inside) != 1:
            continue  # one argument's rule (muse-glimmer's: the function's own, when it has one argument)
        name = _tagged_literal(arena, inside, "tool-arg-name")
        value = _value_token(arena, node["child"], rules)
        if name is not None and value is not None:
            args[node["name"]] = ("", name, *value)
    for node in parsers:
        # a function's rule (or its "tool" tag, where the call's rule holds them all): its name, the rules it reaches
        if not (node["type"] == "rule" or node["type"] == "tag" and node["tag"] == "tool"):
            continue
        inside = list(_walk(arena, node["child"]))
        functions = {_tagged_literal(arena, [(at, n)], "tool-name") for at, n in inside} - {None}
        if len(functions) == 1:  # one function's (a rule naming several would mix their arguments)
            for rule in _rules_reached(arena, node["child"], rules) | {node.get("name", "")}:
                if rule in args:
                    args[rule] = (next(iter(functions)), *args[rule][1:])
    return {rule: found for rule, found in args.items() if found[0]}


def _tagged_literal(arena: dict[str, Any], nodes: list[tuple[int, dict[str, Any]]], tag: str) -> str | None:
    for _, node in nodes:
        if node["type"] == "tag" and node["tag"] == tag:
            for _, inner in _walk(arena, node["child"]):
                if inner["type"] == "literal":
                    return str(inner["literal"])
    return None


def _rules_reached(arena: dict[str, Any], start: int, rules: dict[str, int]) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for _, node in _walk(arena, todo.pop()):
            if node["type"] in ("rule", "ref") and node["name"] not in seen:
                seen.add(node["name"])
                if node["name"] in rules:
                    todo.append(arena["parsers"][rules[node["name"]]]["child"])
    return seen


def _value_token(arena: dict[str, Any], start: int, rules: dict[str, int], depth: int = 0
                 ) -> tuple[str, str, str] | None:
    """(the grammar token of the raw-text value under `start`, the delimiter it includes or "", the delimiter that
    ends it): an `until-N` (the close follows it in the grammar), an `ac-N` (it holds the close) or the rule holding
    one of those."""
    parsers = arena["parsers"]
    for at, node in _walk(arena, start):
        if node["type"] == "tag" and node["tag"] == "tool-arg-string-value" \
                and parsers[node["child"]]["type"] == "until":
            return f"until-{node['child']}", "", parsers[node["child"]]["delimiters"][0]
        if node["type"] == "ac" and any(n["type"] == "tag" and n["tag"] == "tool-arg-string-value"
                                        for _, n in _walk(arena, node["child"])):
            return f"ac-{at}", node["delimiters"][0], node["delimiters"][0]
        if node["type"] in ("rule", "ref") and depth < 2 and node["name"] in rules:
            inner = _value_token(arena, parsers[rules[node["name"]]]["child"], rules, depth + 1)
            if inner is not None:
                return node["name"], inner[1], inner[2]
    return None


def _gbnf_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _class(chars: str) -> str:
    return "".join("\\" + c if c in "]^-\\" else c for c in dict.fromkeys(chars))


def _bounded_value(rule: str, limit: int | None, close: str, ends: str) -> list[str]:
    """GBNF rules `<rule>-value`: text that opens no tag and does not begin `ends` (its first two characters), at
    most `limit` characters, then `close`. State a{k} (b{i}{k}): at most k more characters (right after the i-th
    character that may begin markup)."""
    ends = ends.lstrip()
    banned = {_TAG_START: ""}  # a character that may begin markup: the characters that may not follow it
    if ends[0] != _TAG_START:
        banned[ends[0]] = ends[1]
    names = {c: f"b{i}" for i, c in enumerate(banned)}
    tail = f" {_gbnf_literal(close)}" if close else ""

    def state(name: str, k: int | None) -> str:
        return f"{rule}-{name}" if k is None else f"{rule}-{name}-{k}"

    def step(after: str, k: int | None) -> str:
        """The alternatives after `after` (a character of `banned`, or "" for any other), k characters left."""
        if after == _TAG_START:  # only whitespace may follow "<" ("a < b"): no tag, "<#1>" or "<|" opens
            return f'"" | [ \\t\\r\\n] {state("a", k)}'
        no = banned.get(after, "")
        shifts = "".join(f" | {_gbnf_literal(c)} {state(names[c], k)}" for c in banned if c not in no)
        return f'"" | [^{_class("".join(banned) + no)}] {state("a", k)}{shifts}'

    def first(k: int | None) -> str:
        """The value's first character and what follows (k more), or no value: neither blank nor "<" (SmolLM2
        wrote "\n\n" or "< type=date>" for a zone: whitespace before the close, the schema's markup after "< ")."""
        shifts = "".join(f" | {_gbnf_literal(c)} {state(names[c], k)}" for c in banned if c != _TAG_START)
        return f'"" | [^{_class("".join(banned))} \\t\\r\\n] {state("a", k)}{shifts}'

    if limit is None or limit > _MAX_COUNTED:
        lines = [f"{rule}-value ::= ({first(None)}){tail}", f"{state('a', None)} ::= {step('', None)}"]
        return lines + [f"{state(names[c], None)} ::= {step(c, None)}" for c in banned]
    lines = [f"{rule}-value ::= ({first(limit - 1) if limit else chr(34) * 2}){tail}", f'{state("a", 0)} ::= ""']
    lines += [f'{state(names[c], 0)} ::= ""' for c in banned]
    for k in range(1, limit + 1):
        lines.append(f"{state('a', k)} ::= {step('', k - 1)}")
        lines += [f"{state(names[c], k)} ::= {step(c, k - 1)}" for c in banned]
    return lines


def _max_length(tools: list[dict[str, Any]] | None, function: str, parameter: str) -> tuple[bool, int | None]:
    """(whether `parameter` of `function` is a string and only that, its maxLength)."""
    for tool in tools or []:
        spec = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(spec, dict) and spec.get("name") == function:
            schema = ((spec.get("parameters") or {}).get("properties") or {}).get(parameter)
            if isinstance(schema, dict) and schema.get("type") == "string":
                limit = schema.get("maxLength")
                return True, limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0 else None
    return False, None


def _bound_strings(lines: list[str], arena: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[str]:
    """`lines` with each raw-text string argument's value bounded (see _bounded_value)."""
    values = _string_values(arena)
    out: list[str] = []
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        found = values.get(name) if sep else None
        if found is not None:
            function, parameter, token, close, ends = found
            string, limit = _max_length(tools, function, parameter)
            tokens = _TOKEN.findall(body)
            if string and token in tokens and len(ends.strip()) > 1:
                at = tokens.index(token)
                tokens[at] = f"{name}-value"
                line = f"{name} ::= {' '.join(tokens)}"
                out.append(line)
                out.extend(_bounded_value(name, limit, close, ends))
                continue
        out.append(line)
    return out


def _bound_inline_strings(lines: list[str], arena: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[str]:
    """`lines` with the raw-text string values a function's own rule holds inline, one shared rule for all its
    arguments (muse-glimmer's `<atem:parameter name="city"> ac-N`, where a function has several), bounded as
    _bound_strings bounds an argument's own rule: SmolLM2 could write markup and any length there."""
    parsers = arena["parsers"]
    values: dict[str, tuple[str, str]] = {}  # {the value's token: (the close it includes or "", what ends it)}
    for at, node in enumerate(parsers):
        child = parsers[node["child"]] if node["type"] == "tag" else None
        if child is not None and node["tag"] == "tool-arg-string-value" and child["type"] == "until":
            values[f"until-{node['child']}"] = ("", child["delimiters"][0])
        elif node["type"] == "ac" and any(n["type"] == "tag" and n["tag"] == "tool-arg-string-value"
                                          for _, n in _walk(arena, node["child"])):
            values[f"ac-{at}"] = (node["delimiters"][0], node["delimiters"][0])
    functions = _function_rules(arena)
    out: list[str] = []
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        tokens = _TOKEN.findall(body) if sep and name in functions else []
        if not values.keys() & set(tokens):
            out.append(line)
            continue
        added: dict[str, list[str]] = {}
        for i, tok in enumerate(tokens):
            if tok not in values or len(values[tok][1].strip()) < 2:
                continue
            # the parameter: the nearest literal before the value (`("<atem:parameter name=\"" "city" "\">") ac-N`)
            named = [_literal(t) for t in tokens[max(0, i - 4):i]]
            param = next((n for n in reversed(named) if n and _max_length(tools, functions[name], n)[0]), None)
            if param is None:
                continue
            rule = f"{name}-{re.sub(r'[^A-Za-z0-9-]', '-', param)}-arg"
            if rule not in added:
                added[rule] = _bounded_value(rule, _max_length(tools, functions[name], param)[1], *values[tok])
            tokens[i] = f"{rule}-value"
        out.append(f"{name} ::= {' '.join(tokens)}" if added else line)
        out.extend(r for rules in added.values() for r in rules)
    return out


def _literal(token: str) -> str | None:
    """The text of a GBNF literal token (None: not a literal, or an escape JSON does not read)."""
    try:
        text = json.loads(token) if token.startswith('"') else None
    except ValueError:
        return None
    return text if isinstance(text, str) else None


# The python-style calls (LFM2's `[get_time(zone="UTC")]`) list their arguments as `arg ("," space arg)*`, any
# argument any number of times: SmolLM2 wrote `zone="UTC", zone="..."`, a key repeated (the parser keeps both). In a
# forced call each argument comes at most once and the schema's required ones always, in any order (up to
# _MAX_PERMUTED arguments; beyond that in the schema's order).
_MAX_PERMUTED = 4


def _first_literal(alts: Alts) -> str | None:
    for seq in alts:
        for tok, _ in seq:
            found = tok if isinstance(tok, str) and tok.startswith('"') else None
            if found is None and not isinstance(tok, str):
                found = _first_literal(tok)
            if found is not None:
                return found
        return None
    return None


def _orders(names: list[str], required: set[str]) -> list[list[str]]:
    from itertools import combinations, permutations

    if len(names) > _MAX_PERMUTED:
        # the required ones (or the first: the list has one argument at least), then the others, each optional
        first = [n for n in names if n in required] or names[:1]
        return [first + [n for n in names if n not in first]]
    out = []
    for k in range(1, len(names) + 1):
        for subset in combinations(names, k):
            if required <= set(subset):
                out.extend(list(order) for order in permutations(subset))
    return out


def _each_once(alts: Alts, required: set[str] | None) -> tuple[Alts, bool]:
    """`alts` with `X ("," space X)*` (X: a choice of arguments) as each argument at most once."""
    changed = False
    out: Alts = []
    for seq in alts:
        new: list[list[Any]] = []
        at = 0
        while at < len(seq):
            tok, rep = seq[at]
            after = seq[at + 1] if at + 1 < len(seq) else None
            if not isinstance(tok, str) and rep == "" and after is not None and after[1] == "*" \
                    and not isinstance(after[0], str) and len(after[0]) == 1 \
                    and [t for t, _ in after[0][0][:2]] == ['","', "space"] and len(after[0][0]) == 3 \
                    and after[0][0][2] == [tok, ""]:
                args = {}
                for alt in tok:
                    literal = _first_literal([alt])
                    args[json.loads(literal) if literal else ""] = alt
                if "" not in args:
                    known = set(args) if required is None else required & set(args)
                    choices: Alts = []
                    for order in _orders(list(args), known):
                        items: list[list[Any]] = []
                        for i, name in enumerate(order):
                            part = [[[args[name]], ""]] if i == 0 else [['","', ""], ["space", ""], [[args[name]], ""]]
                            if i > 0 and name not in known and len(args) > _MAX_PERMUTED:
                                part = [[[part], "?"]]
                            items.extend(part)
                        choices.append(items)
                    new.append([choices, ""])
                    at += 2
                    changed = True
                    continue
            if not isinstance(tok, str):
                tok, inner = _each_once(tok, required)
                changed |= inner
            new.append([tok, rep])
            at += 1
        out.append(new)
    return out, changed


def _function_rules(arena: dict[str, Any]) -> dict[str, str]:
    """{a rule that names exactly one function: that function's name}."""
    functions = {}
    for node in arena["parsers"]:
        if node["type"] == "rule":
            found = {_tagged_literal(arena, [(at, n)], "tool-name") for at, n in _walk(arena, node["child"])} - {None}
            if len(found) == 1:
                functions[node["name"]] = found.pop()
    return functions


def _args_once(lines: list[str], arena: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[str]:
    """`lines` with each function's python-style argument list taking each argument at most once (see above)."""
    functions = _function_rules(arena)
    out = []
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        if sep and name in functions and '"," space' in body:
            required = None
            for tool in tools or []:
                spec = tool.get("function", tool) if isinstance(tool, dict) else {}
                if isinstance(spec, dict) and spec.get("name") == functions[name]:
                    listed = (spec.get("parameters") or {}).get("required")
                    required = {str(r) for r in listed} if isinstance(listed, list) else set()
            alts, changed = _each_once(_parse(_TOKEN.findall(body))[0], required)
            if changed:
                line = f"{name} ::= {_render(alts)}"
        out.append(line)
    return out


# Gemma 4 writes a call's arguments as its own dict (`call:get_time{zone:<|"|>UTC<|"|>}`), and llama.cpp's grammar
# takes any dict there (`tool-get_time ::= ("get_time") gemma4-dict`: any keys, any values): SmolLM2 wrote keys and
# shapes the schema does not have. A forced call's dict is the schema's top-level properties instead: each key at most
# once, the required ones always (in any order up to _MAX_PERMUTED keys), each value of its type (a string opens no
# markup and keeps its maxLength; an object, array or a type not named: any Gemma 4 value).
_GEMMA4_QUOTE = '<|"|>'


def _gemma4_value(rule: str, schema: Any) -> tuple[str, list[str]]:
    """(the GBNF of a value of `schema`, the rules it needs)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(schema, dict) and isinstance(schema.get("enum"), list) and schema["enum"] \
            and all(isinstance(v, str) for v in schema["enum"]):
        return "(" + " | ".join(_gbnf_literal(_GEMMA4_QUOTE + v + _GEMMA4_QUOTE) for v in schema["enum"]) + ")", []
    if kind == "string":
        limit = schema.get("maxLength")
        limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0 else None
        return f"{_gbnf_literal(_GEMMA4_QUOTE)} {rule}-value", _bounded_value(rule, limit, _GEMMA4_QUOTE, _GEMMA4_QUOTE)
    simple = {"number": "gemma4-number", "integer": '"-"? ("0" | [1-9] [0-9]{0,17})', "boolean": "gemma4-bool",
              "null": "gemma4-null"}
    return simple.get(kind, "gemma4-value") if isinstance(kind, str) else "gemma4-value", []


def _gemma4_args(lines: list[str], tools: list[dict[str, Any]] | None) -> list[str]:
    """`lines` with each function's `gemma4-dict` arguments shaped by its schema (see above)."""
    if not any(line.startswith("gemma4-dict ::= ") for line in lines):
        return lines
    schemas = {}
    for tool in tools or []:
        spec = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            # llama.cpp's rule names write "_" (any character but letters, digits and "-") as "-"
            schemas[f"tool-{re.sub(r'[^A-Za-z0-9-]', '-', spec['name'])}"] = spec.get("parameters") or {}
    out: list[str] = []
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        tokens = _TOKEN.findall(body) if sep else []
        schema = schemas.get(name)
        props = schema.get("properties") if isinstance(schema, dict) else None
        if not (tokens and tokens[-1] == "gemma4-dict" and isinstance(props, dict)
                and all(isinstance(k, str) and k and not set(k) & set(":}") for k in props)):
            out.append(line)
            continue
        listed = schema.get("required")
        required = {r for r in listed if r in props} if isinstance(listed, list) else set()
        keys, extra = {}, []
        for i, (key, sub) in enumerate(props.items()):
            value, rules = _gemma4_value(f"{name}-arg{i}", sub)
            keys[key] = f"{_gbnf_literal(key + ':')} space {value}"
            extra += rules
        names = list(keys)
        if len(names) <= _MAX_PERMUTED:
            orders = _orders(names, required) if names else []
            alts = [' "," space '.join(keys[k] for k in order) for order in orders]
            if not required:
                alts.append("")
            args = " | ".join(f"{alt} space" if alt else '""' for alt in alts) if alts else '""'
        else:  # the required keys in the schema's order, then the others, each optional
            first = [k for k in names if k in required] or names[:1]
            rest = "".join(f' ("," space {keys[k]})?' for k in names if k not in first)
            args = ' "," space '.join(keys[k] for k in first) + rest + " space"
            if not required:
                args = f'({args})?'
        out.append(f'{name} ::= {" ".join(tokens[:-1])} "{{" space ({args}) "}}"')
        out.extend(extra)
    return out


def _literals(alts: Alts) -> Iterator[str]:
    for seq in alts:
        for tok, _ in seq:
            if isinstance(tok, str):
                if tok.startswith('"'):
                    yield json.loads(tok)
            else:
                yield from _literals(tok)


def _tagged_args_once(lines: list[str], arena: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[str]:
    """`lines` with a function's `((arg | arg ...) space)*` (muse-glimmer's parameters: any of them, any number of
    times, none at all: SmolLM2 wrote `city` six times; Kimi-K3's `(arg-rule)*`) as each argument at most once and
    the schema's required ones always, in any order (up to _MAX_PERMUTED; beyond, as llama.cpp wrote it)."""
    functions = _function_rules(arena)
    arg_rules = {}  # {the rule of one argument: its name}
    for node in arena["parsers"]:
        if node["type"] == "rule":
            inside = list(_walk(arena, node["child"]))
            name = _tagged_literal(arena, inside, "tool-arg-name")
            if name is not None and sum(n["type"] == "tag" and n["tag"] == "tool-arg" for _, n in inside) == 1:
                arg_rules[node["name"]] = name
    schemas = {}
    for tool in tools or []:
        spec = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            schemas[spec["name"]] = spec.get("parameters") or {}

    def rewrite(alts: Alts, props: dict[str, Any], required: set[str]) -> bool:
        changed = False
        for seq in alts:
            for item in seq:
                tok, rep = item
                if isinstance(tok, str):
                    continue
                spaced = len(tok) == 1 and len(tok[0]) == 2 and tok[0][1] == ["space", ""] \
                    and not isinstance(tok[0][0][0], str) and tok[0][0][1] == ""
                # or Kimi-K3's `(arg-rule | ...)*`, each alternative one argument's rule
                ruled = all(len(alt) == 1 and alt[0][1] == "" and isinstance(alt[0][0], str) and alt[0][0] in arg_rules
                            for alt in tok)
                if rep == "*" and (spaced or ruled):
                    args = {}
                    for alt in tok[0][0][0] if spaced else tok:
                        named = [v for v in _literals([alt]) if v in props] if spaced else \
                            [arg_rules[alt[0][0]]] if arg_rules[alt[0][0]] in props else []
                        if len(named) != 1 or named[0] in args:
                            args = {}
                            break
                        args[named[0]] = alt
                    if args and len(args) <= _MAX_PERMUTED and required <= set(args):
                        tail = [["space", ""]] if spaced else []
                        choices: Alts = [[part for name in order for part in ([[[args[name]], ""]] + tail)]
                                         for order in _orders(list(args), required)]
                        item[0], item[1] = choices, "" if required else "?"
                        changed = True
                        continue
                changed |= rewrite(tok, props, required)
        return changed

    out = []
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        schema = schemas.get(functions.get(name, "")) if sep else None
        props = schema.get("properties") if isinstance(schema, dict) else None
        if isinstance(props, dict) and props and "*" in body:
            listed = schema.get("required")
            required = {r for r in listed if r in props} if isinstance(listed, list) else set()
            alts, _ = _parse(_TOKEN.findall(body))
            if rewrite(alts, props, required):
                line = f"{name} ::= {_render(alts)}"
        out.append(line)
    return out
