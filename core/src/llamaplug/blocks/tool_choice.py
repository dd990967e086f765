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
A call's id (string or number, Kimi-K2's index) is bounded to 16 characters, and its arguments follow the
function's schema where llama.cpp's grammar leaves them looser (tool_args.py). The grammar is edited as text
(gbnf_rules.py), its rules read through the parser that made them (parser_arena.py).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from ..errors import InvalidGrammarError
from .gbnf_rules import TOKEN, Alts, edit_bodies, gbnf_literal, parse, refers, render
from .grammar import check_grammar
from .parser_arena import call_rules, content_names, lookahead_end, tagged_literal, walk
from .tool_args import args_once, bound_inline_strings, bound_strings, gemma4_args, tagged_args_once

_log = logging.getLogger("llamaplug.tool_choice")

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
    or after the calls, and with `tools`' raw-text string arguments bounded (bound_strings); the grammar as given
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
        content, reasoning = content_names(arena)
    except (KeyError, TypeError, ValueError, IndexError):
        return grammar
    lines = []
    for line in grammar.splitlines():
        name, sep, body = line.partition(" ::= ")
        if sep and body:
            body = _without(body, content, reasoning)
            if parallel is False:
                body = _one_call(body, call_rules(arena))
            body = body.replace(_ID, _BOUNDED_ID).replace(_INDEX, _BOUNDED_INDEX)
            line = f"{name} ::= {body}"
        lines.append(line)
    lines = _one_thinking(lines, reasoning, call_rules(arena) | {"tool-call"})
    lines = _no_space_before_lookahead(lines, arena)
    lines = _named_recipient(lines, arena)
    if parallel is False:
        lines = _one_function(lines, arena)
    lines = gemma4_args(args_once(bound_strings(lines, arena, tools), arena, tools), tools)
    lines = tagged_args_once(lines, arena, tools)
    lines = bound_inline_strings(lines, arena, tools)
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
            for tok in TOKEN.findall(body):
                try:
                    text = json.loads(tok) if tok.startswith('"') else None
                except ValueError:  # a GBNF escape JSON does not read (\x..): left as written
                    text = None
                if isinstance(text, str) and tag in text:
                    pieces = text.split(tag)
                    out = [gbnf_literal(pieces[0])] if pieces[0] else []
                    for piece in pieces[1:]:
                        out += [refs] + ([gbnf_literal(piece)] if piece else [])
                    tok = f"({' '.join(out)})"
                parts.append(tok)
            line = f"{name} ::= {' '.join(parts)}"
        lines.append(line)
    return "\n".join(lines) + ("\n" if grammar.endswith("\n") else "")


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
        out = [seq for seq, was in zip(out, lost) if not was or refers([seq], reasoning)]
    return out, any(lost)


def _without(body: str, content: set[str], reasoning: set[str]) -> str:
    """`body` without its content (see _drop); as given when it names none."""
    tokens = TOKEN.findall(body)
    if not content.intersection(tokens):
        return body
    alts, _ = parse(tokens)
    return render(_drop(alts, content, reasoning)[0])


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
            bodies[name] = TOKEN.findall(body)
    thinking, calling = _reaching(bodies, reasoning), _reaching(bodies, calls)

    def once(alts: Alts) -> bool:
        changed = False
        for seq in alts:
            for item in seq:
                if isinstance(item[0], str):
                    continue
                if item[1] == "*" and refers(item[0], thinking) and not refers(item[0], calling):
                    item[1] = "?"
                    changed = True
                else:
                    changed |= once(item[0])
        return changed

    out = []
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        if sep and "*" in body and thinking.intersection(bodies[name]):
            alts, _ = parse(bodies[name])
            if once(alts):
                line = f"{name} ::= {render(alts)}"
        out.append(line)
    return out


def _no_space_before_lookahead(lines: list[str], arena: dict[str, Any]) -> list[str]:
    """`lines` without the `space` between a rule whose parser ends by looking ahead at a literal and that literal.
    llama.cpp writes no lookahead into GBNF: GLM's `tool-call ::= "<tool_call>" space (tool-get-time) space
    "</tool_call>"` takes whitespace before the close that the parser's `tool-get-time` (`... &"</tool_call>"`)
    refuses, and SmolLM2 wrote it: the reply was an error ("does not match the expected format")."""
    ends = {}
    for node in arena["parsers"]:
        if node["type"] == "rule":
            end = lookahead_end(arena, node["child"])
            if end is not None:
                ends[node["name"]] = gbnf_literal(end)
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

    return edit_bodies(lines, edit)


def _named_recipient(lines: list[str], arena: dict[str, Any]) -> list[str]:
    """`lines` with a call's free-text recipient (muse-glimmer's `" to=" <until "<|message|>">`, the function read from
    the call's own markup) as the function's name, as the template writes it (`to=get_time`): SmolLM2 wrote a
    recipient until max_tokens."""
    parsers = arena["parsers"]
    names = {}
    for node in parsers:
        if node["type"] == "tag" and node["tag"] == "tool-open":
            inside = list(walk(arena, node["child"]))
            function = tagged_literal(arena, inside, "tool-name")
            for _, seq in inside:
                kids = seq.get("children", []) if seq["type"] == "sequence" else []
                for before, after in zip(kids, kids[1:]):
                    if parsers[before]["type"] == "literal" and parsers[before]["literal"].strip() == "to=" \
                            and parsers[after]["type"] == "until" and function:
                        names[f"until-{after}"] = gbnf_literal(function)
    if not names:
        return lines

    def edit(tokens: list[str]) -> list[str]:
        for i, tok in enumerate(tokens):
            # the recipient of this rule's function only (its name is in the rule)
            if tok in names and i > 0 and tokens[i - 1] == '" to="' and names[tok] in tokens:
                tokens[i] = names[tok]
        return tokens

    return edit_bodies(lines, edit)


_FUNCTION_LIST = re.compile(r"(\([A-Za-z0-9_| -]+\))\s*\+")


def _one_function(lines: list[str], arena: dict[str, Any]) -> list[str]:
    """`lines` with a list of functions `(fn-a | fn-b)+` (Kimi-K3's, whatever parallel_tool_calls says) as one: SmolLM2
    wrote two calls with parallel_tool_calls false."""
    functions = set()
    for node in arena["parsers"]:
        if node["type"] == "rule":
            found = {tagged_literal(arena, [(at, n)], "tool-name") for at, n in walk(arena, node["child"])} - {None}
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
    tokens = TOKEN.findall(body)
    if len(tokens) == 5 and tokens[0] == "(" and tokens[1] in calls | {"tool-call"} and tokens[2] == "space" \
            and tokens[3] == ")" and tokens[4] == "+":
        return f"{tokens[1]} space"
    return body


