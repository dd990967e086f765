"""JSON Schema -> GBNF: a grammar whose strings are exactly the JSON texts a schema accepts.

    gbnf = schema_to_gbnf({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}},
                           "required": ["n"]})

What is covered: objects (required and optional properties, additionalProperties
false / true / a schema), arrays (items, prefixItems, minItems, maxItems), enum,
const, strings (minLength, maxLength, pattern as far as GBNF can say it, formats
date / time / date-time / uuid), integers with minimum / maximum (exclusive too),
numbers with non-negative integer bounds, $ref / $defs (recursive too), anyOf /
oneOf (as alternatives: a grammar cannot forbid matching two), allOf of object
schemas, nullable and type lists. Every other keyword is an
`UnsupportedSchemaError` naming it and where it is: a grammar is never silently
looser than its schema. Where the schema leaves them open, choices follow
llama.cpp's own converter, so that both accept the same texts: properties come in
the schema's order (required ones first), `additionalProperties` left out of an
object that lists properties means none, and the whitespace between tokens is
llama.cpp's `space` rule.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import InvalidParameterError

SPACE = '| " " | "\\n"{1,2} [ \\t]{0,20}'
PRIMITIVES = {
    "char": r'[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})',
    "integral-part": "[0] | [1-9] [0-9]{0,15}",
    "decimal-part": "[0-9]{1,16}",
    "string": '"\\"" char* "\\""',
    "integer": '("-"? integral-part)',
    "number": '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
    "boolean": '("true" | "false")',
    "null": '"null"',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
    "array": '"[" space ( value ("," space value)* )? space "]"',
    "date": '[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )',
    "time": '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
            '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )',
    "date-time": 'date "T" time',
    "uuid": '[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}',
}
_NEEDS = {"string": ["char"], "integer": ["integral-part"], "number": ["integral-part", "decimal-part"],
          "value": ["object", "array", "string", "number", "boolean", "null"], "object": ["string", "value"],
          "array": ["value"], "date-time": ["date", "time"]}
FORMATS = ("date", "time", "date-time", "uuid")
ANNOTATIONS = {"title", "description", "$schema", "$id", "$comment", "default", "examples", "deprecated",
               "readOnly", "writeOnly", "$defs", "definitions"}
TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "boolean": set(), "null": set(),
}
MAX_DIGITS = 16  # integral-part: at most 16 digits, as llama.cpp's converter allows


class UnsupportedSchemaError(InvalidParameterError):
    """A schema keyword (or value) this converter cannot express exactly; `keyword` and `path` say which."""

    def __init__(self, message: str, keyword: str | None = None, path: str = "#"):
        super().__init__(f"{path}: {message}", field="schema")
        self.keyword, self.path = keyword, path


def literal(text: str) -> str:
    """A GBNF string literal for `text`."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") \
        .replace("\t", "\\t") + '"'


def _class_char(c: str) -> str:
    """One character inside a GBNF character class."""
    if c in "\\]-^[":
        return "\\" + c
    if c == "\n":
        return "\\n"
    if c == "\t":
        return "\\t"
    if c == "\r":
        return "\\r"
    return c


def schema_to_gbnf(schema: Any) -> str:
    """The GBNF grammar (root rule `root`) of the JSON texts `schema` accepts."""
    return _Converter(schema).grammar()


class _Converter:
    def __init__(self, root: Any):
        if not isinstance(root, (dict, bool)):
            raise UnsupportedSchemaError(f"a schema is an object or a boolean, not {type(root).__name__}")
        self.root = root
        self.rules: dict[str, str] = {"space": SPACE}
        self.refs: dict[str, str] = {}

    def grammar(self) -> str:
        body = self.visit(self.root, "root", "#")
        if body != "root":
            self.rules["root"] = body
        return "".join(f"{name} ::= {rule}\n" for name, rule in sorted(self.rules.items()))

    # -- rules --------------------------------------------------------------
    def primitive(self, name: str) -> str:
        if name not in self.rules:
            self.rules[name] = PRIMITIVES[name]
            for needed in _NEEDS.get(name, ()):
                self.primitive(needed)
        return name

    def rule(self, hint: str, body: str) -> str:
        name = re.sub(r"[^a-zA-Z0-9-]+", "-", hint).strip("-") or "r"
        if self.rules.get(name, body) == body:
            self.rules[name] = body
            return name
        i = 1
        while self.rules.get(f"{name}{i}", body) != body:
            i += 1
        self.rules[f"{name}{i}"] = body
        return f"{name}{i}"

    # -- schemas ------------------------------------------------------------
    def visit(self, schema: Any, hint: str, path: str) -> str:
        """A GBNF expression (often a rule name) for `schema`."""
        if schema is True or schema == {}:
            return self.primitive("value")
        if schema is False:
            raise UnsupportedSchemaError("the schema false accepts nothing", "false", path)
        if not isinstance(schema, dict):
            raise UnsupportedSchemaError(f"a schema is an object or a boolean, not {type(schema).__name__}",
                                         None, path)
        if "$ref" in schema:
            self.only(schema, {"$ref"}, path)
            return self.ref(schema["$ref"], path)
        for combinator in ("anyOf", "oneOf"):
            if combinator in schema:
                self.only(schema, {combinator}, path)
                options = schema[combinator]
                if not isinstance(options, list) or not options:
                    raise UnsupportedSchemaError(f"{combinator} needs a non-empty list", combinator, path)
                alts = [self.visit(s, f"{hint}-{i}", f"{path}/{combinator}/{i}") for i, s in enumerate(options)]
                return self.rule(hint, " | ".join(alts))
        if "allOf" in schema:
            self.only(schema, {"allOf"}, path)
            return self.visit(self.merge(schema["allOf"], f"{path}/allOf"), hint, path)
        if "const" in schema:
            self.only(schema, {"const"}, path)
            return self.rule(hint, self.json_literal(schema["const"]))
        if "enum" in schema:
            self.only(schema, {"enum", "type"}, path)
            if not isinstance(schema["enum"], list) or not schema["enum"]:
                raise UnsupportedSchemaError("enum needs a non-empty list", "enum", path)
            return self.rule(hint, "(" + " | ".join(self.json_literal(v) for v in schema["enum"]) + ")")
        kind = schema.get("type")
        if schema.get("nullable") is True:
            rest = {k: v for k, v in schema.items() if k != "nullable"}
            return self.rule(hint, f"{self.visit(rest, hint + '-value', path)} | {self.primitive('null')}")
        if isinstance(kind, list):
            if not kind or not all(t in TYPE_KEYWORDS for t in kind):
                raise UnsupportedSchemaError(f"type must list known types, got {kind!r}", "type", path)
            known = set().union(*(TYPE_KEYWORDS[t] for t in kind))
            self.only(schema, known, path)
            # Each keyword applies to its own type only (minLength to the string, not to null).
            alts = [self.visit({**{k: v for k, v in schema.items() if k in TYPE_KEYWORDS[t] or k in ANNOTATIONS},
                                "type": t}, f"{hint}-{t}", path) for t in kind]
            return self.rule(hint, " | ".join(alts))
        if kind is None:
            if any(k in schema for k in ("properties", "additionalProperties", "required")):
                kind = "object"
            elif any(k in schema for k in ("items", "prefixItems")):
                kind = "array"
            else:
                self.only(schema, set(), path)
                return self.primitive("value")
        handler = {"object": self.object, "array": self.array, "string": self.string, "integer": self.integer,
                   "number": self.number, "boolean": self.simple, "null": self.simple}.get(kind)
        if handler is None:
            raise UnsupportedSchemaError(f"unknown type {kind!r}", "type", path)
        return handler(schema, hint, path)

    def only(self, schema: dict, allowed: set[str], path: str, kind: str | None = None) -> None:
        extra = sorted(set(schema) - allowed - ANNOTATIONS - {"type", "nullable"})
        if extra:
            what = f" for type {kind}" if kind else ""
            raise UnsupportedSchemaError(f"keyword {extra[0]!r} is not supported{what}", extra[0], path)
        if isinstance(schema.get("nullable"), bool) is False and "nullable" in schema:
            raise UnsupportedSchemaError("nullable must be true or false", "nullable", path)

    def json_literal(self, value: Any) -> str:
        return literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))

    def ref(self, ref: Any, path: str) -> str:
        if ref in self.refs:
            return self.refs[ref]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise UnsupportedSchemaError(f"$ref {ref!r}: only local references (#/...) are supported", "$ref", path)
        target: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise UnsupportedSchemaError(f"$ref {ref!r} points at nothing", "$ref", path)
            target = target[part]
        name = self.rule("ref" + re.sub(r"[^a-zA-Z0-9]+", "-", ref[1:]) if ref != "#" else "root", "")
        self.refs[ref] = name  # before visiting: the target may refer to itself
        body = self.visit(target, name + "-body", ref)
        self.rules[name] = body
        return name

    def resolve(self, schema: Any, path: str) -> Any:
        seen = set()
        while isinstance(schema, dict) and "$ref" in schema:
            ref = schema["$ref"]
            if ref in seen:
                raise UnsupportedSchemaError(f"allOf through the cycle {ref!r}", "allOf", path)
            seen.add(ref)
            target: Any = self.root
            for part in [p for p in str(ref)[1:].split("/") if p]:
                target = target.get(part) if isinstance(target, dict) else None
            if target is None:
                raise UnsupportedSchemaError(f"$ref {ref!r} points at nothing", "$ref", path)
            schema = target
        return schema

    def merge(self, parts: Any, path: str) -> dict:
        if not isinstance(parts, list) or not parts:
            raise UnsupportedSchemaError("allOf needs a non-empty list", "allOf", path)
        resolved = [self.resolve(p, f"{path}/{i}") for i, p in enumerate(parts)]
        if len(resolved) == 1:
            return resolved[0]
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for i, part in enumerate(resolved):
            if not isinstance(part, dict) or part.get("type", "object") != "object" or not set(part) <= (
                    {"type", "properties", "required", "additionalProperties"} | ANNOTATIONS):
                raise UnsupportedSchemaError("allOf is supported for object schemas (properties, required) only",
                                             "allOf", f"{path}/{i}")
            merged["properties"].update(part.get("properties", {}))
            merged["required"] += [r for r in part.get("required", []) if r not in merged["required"]]
            if "additionalProperties" in part:
                merged["additionalProperties"] = part["additionalProperties"]
        return merged

    # -- types --------------------------------------------------------------
    def simple(self, schema: dict, hint: str, path: str) -> str:
        self.only(schema, set(), path, schema["type"])
        return self.primitive(schema["type"])

    def object(self, schema: dict, hint: str, path: str) -> str:
        self.only(schema, {"properties", "required", "additionalProperties"}, path, "object")
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(props, dict) or not isinstance(required, list):
            raise UnsupportedSchemaError("properties must be an object and required a list", "properties", path)
        missing = [r for r in required if r not in props]
        if missing:
            raise UnsupportedSchemaError(f"required property {missing[0]!r} is not in properties", "required", path)
        extra = schema.get("additionalProperties", not props)
        if not props and extra is True:
            return self.primitive("object")
        kv = {name: self.rule(f"{hint}-{name}-kv", f'{literal(json.dumps(name, ensure_ascii=False))} space ":" space '
                              f'{self.visit(sub, f"{hint}-{name}", f"{path}/properties/{name}")}')
              for name, sub in props.items()}
        must = [kv[n] for n in props if n in required]
        may = [kv[n] for n in props if n not in required]
        more = None
        if extra is not False:
            value = self.visit(extra, f"{hint}-additional", f"{path}/additionalProperties")
            key = self.rule(f"{hint}-additional-k", f'"\\"" {self.not_in(list(props))} "\\""')
            more = self.rule(f"{hint}-additional-kv", f'{key} ":" space {value}')

        def tail(start: int) -> str:
            parts = [f'( "," space {m} )?' for m in may[start:]]
            if more:
                parts.append(f'( "," space {more} )*')
            return " ".join(parts)

        if must:
            body = ' "," space '.join(must) + (" " + tail(0) if tail(0) else "")
        else:
            heads = [f"{m} {tail(i + 1)}".strip() for i, m in enumerate(may)]
            if more:
                heads.append(f'{more} ( "," space {more} )*')
            body = f"( {' | '.join(heads)} )?" if heads else ""
        return self.rule(hint, f'"{{" space {body} space "}}"' if body else '"{" space "}"')

    def not_in(self, names: list[str]) -> str:
        """Key text (between the quotes) that is none of `names` (a trie of the names, negated)."""
        self.primitive("char")
        trie: dict = {}
        for name in names:
            node = trie
            for c in name:
                node = node.setdefault(c, {})
            node[""] = {}  # the end of a name

        def visit(node: dict) -> str:
            chars = sorted(c for c in node if c)
            alts = [f"[{_class_char(c)}] {visit(node[c])}".strip() for c in chars]
            others = "".join(_class_char(c) for c in chars)
            alts.append(f'([^"\\\\\\x7F\\x00-\\x1F{others}] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{{4}})) char*')
            body = "( " + " | ".join(alts) + " )"
            return body if "" in node else body + "?"

        return visit(trie)

    def array(self, schema: dict, hint: str, path: str) -> str:
        self.only(schema, {"items", "prefixItems", "minItems", "maxItems"}, path, "array")
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        if not isinstance(lo, int) or lo < 0 or (hi is not None and (not isinstance(hi, int) or hi < lo)):
            raise UnsupportedSchemaError("minItems/maxItems must be counts with minItems <= maxItems", "minItems",
                                         path)
        if "prefixItems" in schema:
            if "minItems" in schema or "maxItems" in schema:
                raise UnsupportedSchemaError("minItems/maxItems with prefixItems", "prefixItems", path)
            fixed = [self.visit(s, f"{hint}-{i}", f"{path}/prefixItems/{i}")
                     for i, s in enumerate(schema["prefixItems"])]
            rest = schema.get("items", False)
            body = ' "," space '.join(fixed)
            if rest is not False:
                item = self.visit(rest, f"{hint}-item", f"{path}/items")
                body += f' ( "," space {item} )*' if fixed else f' ( {item} ( "," space {item} )* )?'
            return self.rule(hint, f'"[" space {body} space "]"')
        item = self.visit(schema.get("items", True), f"{hint}-item", f"{path}/items")
        if hi == 0:
            return self.rule(hint, '"[" space "]"')
        more = f'( "," space {item} )' + (f"{{{max(lo - 1, 0)},{hi - 1}}}" if hi is not None else
                                           (f"{{{lo - 1},}}" if lo > 1 else "*"))
        seq = f"{item} {more}"
        return self.rule(hint, f'"[" space {seq if lo else f"( {seq} )?"} space "]"')

    def string(self, schema: dict, hint: str, path: str) -> str:
        self.only(schema, {"minLength", "maxLength", "pattern", "format"}, path, "string")
        if "format" in schema:
            fmt = schema["format"]
            if fmt not in FORMATS or len(set(schema) - ANNOTATIONS - {"type", "format"}):
                raise UnsupportedSchemaError(f"format {fmt!r} is not supported (only {', '.join(FORMATS)}, alone)",
                                             "format", path)
            return self.rule(f"{fmt}-string", f'"\\"" {self.primitive(fmt)} "\\""')
        if "pattern" in schema:
            if "minLength" in schema or "maxLength" in schema:
                raise UnsupportedSchemaError("minLength/maxLength with a pattern", "pattern", path)
            return self.rule(hint, f'"\\"" {_Pattern(schema["pattern"], path, self).gbnf()} "\\""')
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        if not isinstance(lo, int) or lo < 0 or (hi is not None and (not isinstance(hi, int) or hi < lo)):
            raise UnsupportedSchemaError("minLength/maxLength must be counts with minLength <= maxLength",
                                         "minLength", path)
        self.primitive("char")
        if lo == 0 and hi is None:
            return self.primitive("string")
        count = f"{{{lo},{hi}}}" if hi is not None else f"{{{lo},}}"
        return self.rule(hint, f'"\\"" char{count} "\\""')

    def integer(self, schema: dict, hint: str, path: str) -> str:
        self.only(schema, {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}, path, "integer")
        lo, hi = _bounds(schema, path, integer=True)
        if lo is None and hi is None:
            return self.primitive("integer")
        return self.rule(hint, "(" + int_range(lo, hi) + ")")

    def number(self, schema: dict, hint: str, path: str) -> str:
        self.only(schema, {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}, path, "number")
        if not any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
            return self.primitive("number")
        if "exclusiveMinimum" in schema or "exclusiveMaximum" in schema:
            raise UnsupportedSchemaError("exclusive bounds of a number", "exclusiveMinimum", path)
        if "minimum" not in schema:
            raise UnsupportedSchemaError("a number bounded by maximum alone (give minimum >= 0 too)", "maximum", path)
        lo, hi = schema["minimum"], schema.get("maximum")
        for key, bound in (("minimum", lo), ("maximum", hi)):
            if bound is not None and not (isinstance(bound, (int, float)) and float(bound).is_integer()
                                          and bound >= 0):
                raise UnsupportedSchemaError(f"{key} of a number must be a non-negative integer here, got {bound}",
                                             key, path)
        self.primitive("decimal-part")
        lo = int(lo)
        if hi is None:
            return self.rule(hint, f'({int_range(lo, None)}) ("." decimal-part)?')
        hi = int(hi)
        if hi < lo:
            raise UnsupportedSchemaError(f"maximum {hi} is below minimum {lo}", "maximum", path)
        top = f'{literal(str(hi))} ("." [0]{{1,16}})?'
        if hi == lo:
            return self.rule(hint, top)
        return self.rule(hint, f'({int_range(lo, hi - 1)}) ("." decimal-part)? | {top}')


def _bounds(schema: dict, path: str, integer: bool) -> tuple[int | None, int | None]:
    lo = hi = None
    for key, exclusive, is_low in (("minimum", False, True), ("exclusiveMinimum", True, True),
                                   ("maximum", False, False), ("exclusiveMaximum", True, False)):
        if key not in schema:
            continue
        v = schema[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UnsupportedSchemaError(f"{key} must be a number, got {v!r}", key, path)
        if is_low:
            b = int(v) + 1 if exclusive and float(v).is_integer() else -int(-v // 1)  # ceil
            lo = b if lo is None else max(lo, b)
        else:
            b = int(v) - 1 if exclusive and float(v).is_integer() else int(v // 1)  # floor
            hi = b if hi is None else min(hi, b)
    if lo is not None and hi is not None and lo > hi:
        raise UnsupportedSchemaError(f"minimum {lo} is above maximum {hi}: no integer fits", "minimum", path)
    return lo, hi


def _digits_range(x: str, y: str) -> str:
    """Digit strings of one length from x to y (x <= y), as GBNF."""
    if x == y:
        return literal(x)
    if len(x) == 1:
        return f"[{x}-{y}]" if x != y else literal(x)
    if x[0] == y[0]:
        return f"{literal(x[0])} ({_digits_range(x[1:], y[1:])})"
    n = len(x) - 1
    alts = [f"{literal(x[0])} ({_digits_range(x[1:], '9' * n)})"]
    if int(x[0]) + 1 <= int(y[0]) - 1:
        alts.append(f"[{int(x[0]) + 1}-{int(y[0]) - 1}] [0-9]{{{n}}}")
    alts.append(f"{literal(y[0])} ({_digits_range('0' * n, y[1:])})")
    return " | ".join(alts)


def _natural_range(lo: int, hi: int | None) -> str:
    """Decimal numerals without leading zeros for lo..hi (hi None: up to MAX_DIGITS digits)."""
    alts = []
    top_len = len(str(hi)) if hi is not None else MAX_DIGITS
    for length in range(len(str(lo)), top_len + 1):
        a = max(lo, 10 ** (length - 1) if length > 1 else 0)
        b = min(hi, 10 ** length - 1) if hi is not None else 10 ** length - 1
        if a <= b:
            alts.append(_digits_range(str(a), str(b)))
    if hi is None and alts:
        # Every longer numeral up to MAX_DIGITS digits: one rule instead of one per length.
        first = len(str(lo))
        alts = alts[:1] + ([f"[1-9] [0-9]{{{first},{MAX_DIGITS - 1}}}"] if first < MAX_DIGITS else [])
    return " | ".join(f"({a})" if " | " in a else a for a in alts)


def int_range(lo: int | None, hi: int | None) -> str:
    """Integers lo..hi (None: unbounded on that side, within 16 digits), as GBNF."""
    alts = []
    if lo is None or lo < 0:  # the negative part: "-" then lo..hi mirrored
        neg_hi = None if lo is None else -lo
        neg_lo = 1 if hi is None or hi >= 0 else -hi
        alts.append(f'"-" ({_natural_range(neg_lo, neg_hi)})')
    if hi is None or hi >= 0:
        alts.append(_natural_range(max(lo or 0, 0), hi))
    return " | ".join(alts)


class _Pattern:
    """A regular expression (the subset GBNF can say) as GBNF; JSON Schema patterns are unanchored."""

    def __init__(self, pattern: Any, path: str, conv: _Converter):
        if not isinstance(pattern, str):
            raise UnsupportedSchemaError("pattern must be a string", "pattern", path)
        self.p, self.i, self.path, self.conv = pattern, 0, path, conv

    def fail(self, what: str) -> UnsupportedSchemaError:
        return UnsupportedSchemaError(f"pattern {self.p!r}: {what} (at offset {self.i})", "pattern", self.path)

    def gbnf(self) -> str:
        self.conv.primitive("char")
        anchored_start = self.p.startswith("^")
        anchored_end = self.p.endswith("$") and not self.p.endswith("\\$")
        self.i = 1 if anchored_start else 0
        end = len(self.p) - (1 if anchored_end else 0)
        self.p = self.p[:end]
        body = self.alternation()
        if self.i != len(self.p):
            raise self.fail("unbalanced ')'")
        return f"{'' if anchored_start else 'char* '}({body}){'' if anchored_end else ' char*'}"

    def alternation(self) -> str:
        alts = [self.sequence()]
        while self.i < len(self.p) and self.p[self.i] == "|":
            self.i += 1
            alts.append(self.sequence())
        return " | ".join(a or '""' for a in alts)

    def sequence(self) -> str:
        items = []
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            atom = self.atom()
            items.append(atom + self.quantifier())
        return " ".join(items)

    def quantifier(self) -> str:
        if self.i >= len(self.p):
            return ""
        c = self.p[self.i]
        if c in "*+?":
            self.i += 1
            if self.i < len(self.p) and self.p[self.i] in "?+":
                raise self.fail("lazy or possessive quantifiers")
            return c
        if c == "{":
            m = re.match(r"\{(\d+)(,(\d*))?\}", self.p[self.i:])
            if not m:
                raise self.fail("a malformed {m,n}")
            self.i += m.end()
            return m.group(0)
        return ""

    def atom(self) -> str:
        c = self.p[self.i]
        self.i += 1
        if c == "(":
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.p.startswith("?", self.i):
                raise self.fail("lookarounds and named groups")
            inner = self.alternation()
            if self.i >= len(self.p) or self.p[self.i] != ")":
                raise self.fail("an unclosed '('")
            self.i += 1
            return f"({inner})"
        if c == "[":
            return self.char_class()
        if c == ".":
            return "char"
        if c == "\\":
            return self.escape(in_class=False)
        if c in "^$":
            raise self.fail("anchors inside the pattern")
        if c in "*+?{":
            raise self.fail(f"nothing to repeat before {c!r}")
        return self.json_char(c)

    @staticmethod
    def json_char(c: str) -> str:
        # Inside a JSON string '"' and '\\' are written escaped, control characters too.
        if c in '"\\':
            return literal("\\" + c)
        if ord(c) < 0x20:
            raise UnsupportedSchemaError(f"control character {c!r} in a pattern", "pattern")
        return literal(c)

    def escape(self, in_class: bool) -> str:
        if self.i >= len(self.p):
            raise self.fail("a trailing backslash")
        c = self.p[self.i]
        self.i += 1
        classes = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " \\t"}
        if c in classes:
            return classes[c] if in_class else f"[{classes[c]}]"
        if c in "DWS":
            raise self.fail(f"\\{c}")
        if c.isalnum():
            raise self.fail(f"the escape \\{c}")
        if in_class:
            return _class_char(c)
        return self.json_char(c)

    def char_class(self) -> str:
        negate = self.p.startswith("^", self.i)
        if negate:
            self.i += 1
        parts = []
        first = True
        while self.i < len(self.p) and (self.p[self.i] != "]" or first):
            first = False
            c = self.p[self.i]
            self.i += 1
            if c == "\\":
                parts.append(self.escape(in_class=True))
                continue
            if c in '"\\' or ord(c) < 0x20:
                raise self.fail("quotes, backslashes or control characters in a character class")
            if self.p.startswith("-", self.i) and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]":
                end = self.p[self.i + 1]
                self.i += 2
                if end == "\\" or ord(end) < ord(c):
                    raise self.fail("a character range")
                parts.append(f"{_class_char(c)}-{_class_char(end)}")
            else:
                parts.append(_class_char(c))
        if self.i >= len(self.p):
            raise self.fail("an unclosed '['")
        self.i += 1
        if negate:
            return f'[^"\\\\\\x7F\\x00-\\x1F{"".join(parts)}]'
        return f"[{''.join(parts)}]"
