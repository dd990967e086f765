"""A forced call's arguments as its function's schema has them (tool_choice.call_first's last edits).

llama.cpp's grammars leave some arguments looser than the schema, and a small model fills the gap until
max_tokens: a raw-text string argument (the XML-style formats) opens no markup and keeps its maxLength
(bound_strings, bound_inline_strings); a python-style call (LFM2) names each argument once (args_once), and so
does a tagged one (tagged_args_once); a Gemma 4 call's dict is its schema's (gemma4_args).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .gbnf_rules import TOKEN, Alts, char_class, first_literal, gbnf_literal, literal, literals, parse, render
from .parser_arena import function_rules, rules_reached, tagged_literal, value_token, walk

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
        inside = list(walk(arena, node["child"]))
        if sum(n["type"] == "tag" and n["tag"] == "tool-arg" for _, n in inside) != 1:
            continue  # one argument's rule (muse-glimmer's: the function's own, when it has one argument)
        name = tagged_literal(arena, inside, "tool-arg-name")
        value = value_token(arena, node["child"], rules)
        if name is not None and value is not None:
            args[node["name"]] = ("", name, *value)
    for node in parsers:
        # a function's rule (or its "tool" tag, where the call's rule holds them all): its name, the rules it reaches
        if not (node["type"] == "rule" or node["type"] == "tag" and node["tag"] == "tool"):
            continue
        inside = list(walk(arena, node["child"]))
        functions = {tagged_literal(arena, [(at, n)], "tool-name") for at, n in inside} - {None}
        if len(functions) == 1:  # one function's (a rule naming several would mix their arguments)
            for rule in rules_reached(arena, node["child"], rules) | {node.get("name", "")}:
                if rule in args:
                    args[rule] = (next(iter(functions)), *args[rule][1:])
    return {rule: found for rule, found in args.items() if found[0]}


def _bounded_value(rule: str, limit: int | None, close: str, ends: str) -> list[str]:
    """GBNF rules `<rule>-value`: text that opens no tag and does not begin `ends` (its first two characters), at
    most `limit` characters, then `close`. State a{k} (b{i}{k}): at most k more characters (right after the i-th
    character that may begin markup)."""
    ends = ends.lstrip()
    banned = {_TAG_START: ""}  # a character that may begin markup: the characters that may not follow it
    if ends[0] != _TAG_START:
        banned[ends[0]] = ends[1]
    names = {c: f"b{i}" for i, c in enumerate(banned)}
    tail = f" {gbnf_literal(close)}" if close else ""

    def state(name: str, k: int | None) -> str:
        return f"{rule}-{name}" if k is None else f"{rule}-{name}-{k}"

    def step(after: str, k: int | None) -> str:
        """The alternatives after `after` (a character of `banned`, or "" for any other), k characters left."""
        if after == _TAG_START:  # only whitespace may follow "<" ("a < b"): no tag, "<#1>" or "<|" opens
            return f'"" | [ \\t\\r\\n] {state("a", k)}'
        no = banned.get(after, "")
        shifts = "".join(f" | {gbnf_literal(c)} {state(names[c], k)}" for c in banned if c not in no)
        return f'"" | [^{char_class("".join(banned) + no)}] {state("a", k)}{shifts}'

    def first(k: int | None) -> str:
        """The value's first character and what follows (k more), or no value: neither blank nor "<" (SmolLM2
        wrote "\n\n" or "< type=date>" for a zone: whitespace before the close, the schema's markup after "< ")."""
        shifts = "".join(f" | {gbnf_literal(c)} {state(names[c], k)}" for c in banned if c != _TAG_START)
        return f'"" | [^{char_class("".join(banned))} \\t\\r\\n] {state("a", k)}{shifts}'

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


def bound_strings(lines: list[str], arena: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[str]:
    """`lines` with each raw-text string argument's value bounded (see _bounded_value)."""
    values = _string_values(arena)
    out: list[str] = []
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        found = values.get(name) if sep else None
        if found is not None:
            function, parameter, token, close, ends = found
            string, limit = _max_length(tools, function, parameter)
            tokens = TOKEN.findall(body)
            if string and token in tokens and len(ends.strip()) > 1:
                at = tokens.index(token)
                tokens[at] = f"{name}-value"
                line = f"{name} ::= {' '.join(tokens)}"
                out.append(line)
                out.extend(_bounded_value(name, limit, close, ends))
                continue
        out.append(line)
    return out


def bound_inline_strings(lines: list[str], arena: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[str]:
    """`lines` with the raw-text string values a function's own rule holds inline, one shared rule for all its
    arguments (muse-glimmer's `<atem:parameter name="city"> ac-N`, where a function has several), bounded as
    bound_strings bounds an argument's own rule: SmolLM2 could write markup and any length there."""
    parsers = arena["parsers"]
    values: dict[str, tuple[str, str]] = {}  # {the value's token: (the close it includes or "", what ends it)}
    for at, node in enumerate(parsers):
        child = parsers[node["child"]] if node["type"] == "tag" else None
        if child is not None and node["tag"] == "tool-arg-string-value" and child["type"] == "until":
            values[f"until-{node['child']}"] = ("", child["delimiters"][0])
        elif node["type"] == "ac" and any(n["type"] == "tag" and n["tag"] == "tool-arg-string-value"
                                          for _, n in walk(arena, node["child"])):
            values[f"ac-{at}"] = (node["delimiters"][0], node["delimiters"][0])
    functions = function_rules(arena)
    out: list[str] = []
    for line in lines:
        name, sep, body = line.partition(" ::= ")
        tokens = TOKEN.findall(body) if sep and name in functions else []
        if not values.keys() & set(tokens):
            out.append(line)
            continue
        added: dict[str, list[str]] = {}
        for i, tok in enumerate(tokens):
            if tok not in values or len(values[tok][1].strip()) < 2:
                continue
            # the parameter: the nearest literal before the value (`("<atem:parameter name=\"" "city" "\">") ac-N`)
            named = [literal(t) for t in tokens[max(0, i - 4):i]]
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


# The python-style calls (LFM2's `[get_time(zone="UTC")]`) list their arguments as `arg ("," space arg)*`, any
# argument any number of times: SmolLM2 wrote `zone="UTC", zone="..."`, a key repeated (the parser keeps both). In a
# forced call each argument comes at most once and the schema's required ones always, in any order (up to
# _MAX_PERMUTED arguments; beyond that in the schema's order).
_MAX_PERMUTED = 4


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
                    literal = first_literal([alt])
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


def args_once(lines: list[str], arena: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[str]:
    """`lines` with each function's python-style argument list taking each argument at most once (see above)."""
    functions = function_rules(arena)
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
            alts, changed = _each_once(parse(TOKEN.findall(body))[0], required)
            if changed:
                line = f"{name} ::= {render(alts)}"
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
        return "(" + " | ".join(gbnf_literal(_GEMMA4_QUOTE + v + _GEMMA4_QUOTE) for v in schema["enum"]) + ")", []
    if kind == "string":
        limit = schema.get("maxLength")
        limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0 else None
        return f"{gbnf_literal(_GEMMA4_QUOTE)} {rule}-value", _bounded_value(rule, limit, _GEMMA4_QUOTE, _GEMMA4_QUOTE)
    simple = {"number": "gemma4-number", "integer": '"-"? ("0" | [1-9] [0-9]{0,17})', "boolean": "gemma4-bool",
              "null": "gemma4-null"}
    return simple.get(kind, "gemma4-value") if isinstance(kind, str) else "gemma4-value", []


def gemma4_args(lines: list[str], tools: list[dict[str, Any]] | None) -> list[str]:
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
        tokens = TOKEN.findall(body) if sep else []
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
            keys[key] = f"{gbnf_literal(key + ':')} space {value}"
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


def tagged_args_once(lines: list[str], arena: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[str]:
    """`lines` with a function's `((arg | arg ...) space)*` (muse-glimmer's parameters: any of them, any number of
    times, none at all: SmolLM2 wrote `city` six times; Kimi-K3's `(arg-rule)*`) as each argument at most once and
    the schema's required ones always, in any order (up to _MAX_PERMUTED; beyond, as llama.cpp wrote it)."""
    functions = function_rules(arena)
    arg_rules = {}  # {the rule of one argument: its name}
    for node in arena["parsers"]:
        if node["type"] == "rule":
            inside = list(walk(arena, node["child"]))
            name = tagged_literal(arena, inside, "tool-arg-name")
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
                        named = [v for v in literals([alt]) if v in props] if spaced else \
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
            alts, _ = parse(TOKEN.findall(body))
            if rewrite(alts, props, required):
                line = f"{name} ::= {render(alts)}"
        out.append(line)
    return out
