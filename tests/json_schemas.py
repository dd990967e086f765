"""JSON schemas for the converter's tests and bench, and a small instance generator.

Every schema here is inside what both our converter and llama.cpp's express exactly
(no number bounds, anchored patterns only, the formats both know), so the two
grammars must accept the same texts. `instances` makes valid texts (several
layouts of whitespace) and near misses from a seeded random generator.
"""

from __future__ import annotations

import json
import random
import string
from typing import Any

SHORT = {"type": "string", "maxLength": 12}
SCHEMAS: list[dict[str, Any]] = [
    {"type": "boolean"},
    {"type": "null"},
    {"type": "integer"},
    {"type": "number"},
    {"type": "string", "maxLength": 16},
    {"type": "string", "minLength": 2, "maxLength": 5},
    {"type": "integer", "minimum": 0, "maximum": 9},
    {"type": "integer", "minimum": -150, "maximum": -7},
    {"type": "integer", "minimum": 18, "maximum": 120},
    {"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 1234},
    {"type": "integer", "minimum": 100},
    {"type": "integer", "maximum": 42},
    {"enum": ["red", "green", "blue"]},
    {"enum": ["a", 1, None, True]},
    {"const": {"ok": True}},
    {"type": ["string", "null"], "maxLength": 8},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "time"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "pattern": "^[a-z]{2,6}-[0-9]{3}$"},
    {"type": "string", "pattern": "^(yes|no|maybe)!?$"},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 4},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3},
    {"type": "array", "items": SHORT, "minItems": 1, "maxItems": 3},
    {"type": "array", "prefixItems": [SHORT, {"type": "integer", "minimum": 0, "maximum": 9}]},
    {"type": "object", "properties": {"name": SHORT, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"a": SHORT, "b": {"type": "boolean"}, "c": {"type": "null"}},
     "required": ["b"]},
    {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": SHORT}},
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}},
     "required": ["id"], "additionalProperties": {"type": "boolean"}},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "maxItems": 3},
                                      "when": {"type": "string", "format": "date"}},
     "required": ["tags", "when"]},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                      {"type": "string", "maxLength": 3}]}},
     "required": ["v"]},
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                                          "y": {"type": "integer", "minimum": -9, "maximum": 9}},
                         "required": ["x", "y"]}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
     "required": ["from", "to"]},
    {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
     "$ref": "#/$defs/node"},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["a"]},
               {"type": "object", "properties": {"b": SHORT}, "required": ["b"]}]},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"},
                                                 "r": {"type": "integer", "minimum": 1, "maximum": 9}},
                "required": ["kind", "r"]},
               {"type": "object", "properties": {"kind": {"const": "square"},
                                                 "side": {"type": "integer", "minimum": 1, "maximum": 9}},
                "required": ["kind", "side"]}]},
]


def _key(rng: random.Random, avoid: set[str]) -> str:
    while True:
        key = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 6)))
        # Not a declared name, nor a prefix of one (llama.cpp's converter refuses those prefixes too).
        if not any(name.startswith(key) for name in avoid):
            return key


def _string(rng: random.Random, lo: int, hi: int) -> str:
    alphabet = string.ascii_letters + string.digits + " _-é☃"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def sample(schema: Any, rng: random.Random, root: dict, depth: int = 0) -> Any:
    """A random instance of `schema` (the subset SCHEMAS uses)."""
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"][2:].split("/"):
            target = target[part]
        return sample(target, rng, root, depth + 1)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = schema[key]
            if depth > 3:  # recursive schemas: take the way out
                options = [o for o in options if "$ref" not in o] or options
            return sample(rng.choice(options), rng, root, depth + 1)
    if "allOf" in schema:
        out: dict[str, Any] = {}
        for part in schema["allOf"]:
            out.update(sample(part, rng, root, depth))
        return out
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return sample({**schema, "type": rng.choice(kind)}, rng, root, depth)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "integer":
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -10**6 - 1) + 1)
        hi = schema.get("maximum", schema.get("exclusiveMaximum", 10**6 + 1) - 1)
        return rng.randint(lo, hi)
    if kind == "number":
        return round(rng.uniform(-1000, 1000), rng.randint(0, 4))
    if kind == "string":
        fmt, pattern = schema.get("format"), schema.get("pattern")
        if fmt == "date":
            return f"{rng.randint(1000, 2999)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        if fmt == "time":
            return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"
        if fmt == "date-time":
            return f"{rng.randint(1000, 2999)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T12:30:00+01:00"
        if fmt == "uuid":
            h = "".join(rng.choice("0123456789abcdef") for _ in range(32))
            return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        if pattern == "^[a-z]{2,6}-[0-9]{3}$":
            return "".join(rng.choice("abcxyz") for _ in range(rng.randint(2, 6))) + f"-{rng.randint(0, 999):03d}"
        if pattern == "^(yes|no|maybe)!?$":
            return rng.choice(["yes", "no", "maybe"]) + rng.choice(["", "!"])
        return _string(rng, schema.get("minLength", 0), schema.get("maxLength", 10))
    if kind == "array":
        if "prefixItems" in schema:
            return [sample(s, rng, root, depth + 1) for s in schema["prefixItems"]]
        n = rng.randint(schema.get("minItems", 0), schema.get("maxItems", 4))
        return [sample(schema["items"], rng, root, depth + 1) for _ in range(n)]
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        out = {k: sample(v, rng, root, depth + 1) for k, v in props.items()
               if k in required or rng.random() < 0.5}
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for _ in range(rng.randint(0, 2)):
                out[_key(rng, set(props))] = sample(extra, rng, root, depth + 1)
        return out
    raise AssertionError(f"no sampler for {schema}")


def layouts(value: Any, rng: random.Random) -> list[str]:
    """The same value written as JSON with whitespace the `space` rule allows."""
    return [json.dumps(value, ensure_ascii=False, separators=(",", ":")),
            json.dumps(value, ensure_ascii=False),
            json.dumps(value, ensure_ascii=False, indent=2)]


def near_misses(value: Any, schema: dict, rng: random.Random) -> list[str]:
    """Texts that a careless grammar would let through."""
    out = [json.dumps(value) + "x", json.dumps(value)[:-1] if len(json.dumps(value)) > 1 else "",
           json.dumps({"wrapped": value}), json.dumps([value]), "  " + json.dumps(value)]
    if isinstance(value, dict) and value:
        first = next(iter(value))
        out.append(json.dumps({k: v for k, v in value.items() if k != first}))
        out.append(json.dumps({**value, first: [value[first]]}))
        out.append(json.dumps(dict(reversed(list(value.items())))))
        out.append(json.dumps({**value, _key(rng, set(schema.get("properties", {}))): 1}))
    if isinstance(value, int) and not isinstance(value, bool):
        out += [json.dumps(value + 1), json.dumps(value - 1), json.dumps(value * 10), json.dumps(-value)]
    if isinstance(value, str):
        out += [json.dumps(value + "z"), json.dumps(value[1:]), json.dumps(value.upper())]
    if isinstance(value, list):
        out += [json.dumps(value + value[:1]), json.dumps(value[1:])]
    return out
