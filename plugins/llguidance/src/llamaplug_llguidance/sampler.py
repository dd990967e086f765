"""The llguidance sampler: llguidance's token mask over llama.cpp's candidates, with numpy.

llguidance computes, for the text so far, a bitmask of the vocabulary (one bit per token id, 32 to an
int32 word). `apply` fills it and sets the logits of the candidates whose bit is clear to -inf,
indexing the unpacked mask with the candidates' ids (no Python loop over the vocabulary); `accept` advances the
matcher by the chosen token. A chain's constraint is asked first about its pick alone (SamplerChain.constrained:
one candidate), which the matcher answers without the mask (up to a millisecond on Gemma's 262k vocabulary).

llguidance's JSON-schema compiler recurses once per level of the schema, a local `$ref` counting as the levels of
what it points at, with up to 4.5 KB of stack a level (1.9.1: 1,880 nested arrays, or a chain of 920 `$defs` each
an object whose property is a `$ref` to the next, overflow an 8 MiB thread stack and kill the process). So a
grammar (grammar text, or a schema of more than INLINE_DEPTH levels) is compiled on a thread of its own with
COMPILE_STACK of stack (reserved, touched only as deep as the compiler goes), and a schema deeper than MAX_DEPTH,
which that stack holds with room to spare, is refused here by name before llguidance sees it; llguidance's own bound
(50,000 compiled subschemas: "schema too large") refuses deeper ones anyway. The schema is given to llguidance as
a dict, not as JSON text: its text reader (serde_json) stops at 128 levels ("recursion limit exceeded").
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import llguidance
import llguidance.numpy
import numpy as np

from llamaplug import InvalidParameterError, SamplingError

_tokenizers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
# Levels of a JSON schema, its local $refs followed (see the module's doc): 50,000 (a chain of 49,990 `$ref`s
# compiles in 0.9 s) take at most ~225 MB of stack, under half of COMPILE_STACK.
MAX_DEPTH = 50_000
COMPILE_STACK = 512 * 1024 * 1024
# Up to this many levels a schema compiles on the caller's thread (~1.2 MB of stack, within the 2 MiB a thread gets
# where the stack limit is unlimited): a thread started per compile costs about a millisecond.
INLINE_DEPTH = 256
# A `pattern` longer than this is refused by name: llguidance's lexer builds its first state in time that grows with
# the square of a pattern's groups (5,000 optional groups, 20,000 characters: 0.25 s; 30,000: 9 s; 100,001: 100 s,
# then a panic in 1.9.1's regex engine), time a request would hold its slot for.
MAX_PATTERN = 20_000
# Three of llguidance's own bounds raised, each still a bound: the size of a grammar's initial lexer (1.9.1's
# default 1,000,000 refuses an enum of 100,001 integers, which compiles in 0.4 s under 4x that: compile time); the
# parser's items in one row (its 2,000 stop an object of 600 optional properties at its first key, about 4 items a
# property); and the lexer's work in one step (its 200,000 stop 3,000 long keys sharing a 210-character prefix at
# their first letter: "too many expressions constructed"; 2,000,000 take it in 0.4 s, once). The last two bound the
# time of one token.
LIMITS = llguidance.LLParserLimits(initial_lexer_fuel=4_000_000, max_items_in_row=20_000,
                                   step_lexer_fuel=2_000_000)
# Up to this many candidates are checked one by one (validate_tokens) rather than with the whole mask.
FEW_CANDIDATES = 8
_END = object()
_lock = threading.Lock()


class _Vocabulary:
    """What llguidance's TokenizerWrapper asks of a tokenizer, from a llamaplug model's own vocabulary."""

    def __init__(self, model: Any):
        self._model = model
        self.eos_token_id = model.eos
        self.bos_token_id = model.bos
        self.tokens: list[bytes] = []
        self.special_token_ids: list[int] = []
        for token in range(model.n_vocab):
            piece = model.token_to_piece(token, True)
            if model.token_is_control(token):
                # llguidance's mark of a special token (as its llama.cpp binding writes them)
                piece = b"\xff" + piece
                self.special_token_ids.append(token)
            self.tokens.append(piece)

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._model.tokenize(text, False, False)


def tokenizer_for(model: Any) -> Any:
    """llguidance's tokenizer of `model`'s vocabulary (made once per model: about a second for 128k tokens)."""
    with _lock:
        found = _tokenizers.get(model)
        if found is None:
            eos = [t for t in range(model.n_vocab) if model.token_is_eog(t)] or None
            found = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary(model)), n_vocab=model.n_vocab,
                                           eos_token=eos)
            _tokenizers[model] = found
        return found


def _pointer(root: Any, ref: str) -> Any:
    """The value a local `$ref` ("#/$defs/a") points at in `root`, or None (another document, an anchor, nothing)."""
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def schema_depth(schema: Any, bound: int = MAX_DEPTH) -> int:
    """The levels llguidance's compiler recurses through for `schema`: dicts and lists nested, a local `$ref` adding
    the levels of its target (one back into its own path is recursion, which the compiler makes one rule of:
    nothing more). Counted without recursion, each value once; stops once past `bound`."""
    if not isinstance(schema, dict | list):
        return 0

    def below(node: Any) -> Iterator[Any]:
        values = node.values() if isinstance(node, dict) else node
        found = [v for v in values if isinstance(v, dict | list)]
        ref = node.get("$ref") if isinstance(node, dict) else None
        if isinstance(ref, str) and ref.startswith("#"):
            target = _pointer(schema, ref)
            if isinstance(target, dict | list):
                found.append(target)
        return iter(found)

    done: dict[int, int] = {}
    path: list[tuple[Any, Iterator[Any], list[int]]] = [(schema, below(schema), [0])]  # node, to visit, deepest
    on_path = {id(schema)}
    while path:
        if len(path) > bound:
            return len(path)
        node, todo, deepest = path[-1]
        child = next(todo, _END)
        if child is _END:
            path.pop()
            on_path.discard(id(node))
            done[id(node)] = 1 + deepest[0]
            if path:
                path[-1][2][0] = max(path[-1][2][0], done[id(node)])
        elif id(child) in done:
            deepest[0] = max(deepest[0], done[id(child)])
        elif id(child) not in on_path:
            path.append((child, below(child), [0]))
            on_path.add(id(child))
    return done[id(schema)]


def long_pattern(schema: Any) -> str | None:
    """Where in `schema` a `pattern` (or a patternProperties key) is longer than MAX_PATTERN, as a JSON pointer."""
    todo: list[tuple[Any, str]] = [(schema, "#")]
    while todo:
        node, path = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            here = f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"
            if key == "pattern" and isinstance(value, str) and len(value) > MAX_PATTERN:
                return here
            if key == "patternProperties" and isinstance(value, dict):
                for regex in value:
                    if len(regex) > MAX_PATTERN:
                        return f"{here}/{regex[:40]}..."
            if isinstance(value, dict | list):
                todo.append((value, here))
    return None


def grammar_of(json_schema: Any = None, lark: str | None = None,
               grammar: str | None = None) -> tuple[str | dict[str, Any], str, bool]:
    """llguidance's grammar for the one constraint given, the field it came from, and whether it may compile on the
    caller's thread (a schema of at most INLINE_DEPTH levels; grammar text is read by recursive parsers too)."""
    given = [(k, v) for k, v in (("json_schema", json_schema), ("lark", lark), ("grammar", grammar)) if v is not None]
    if len(given) != 1:
        raise InvalidParameterError("the llguidance sampler takes exactly one of json_schema, lark or grammar",
                                    field="sampler")
    field, value = given[0]
    if field == "json_schema":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise InvalidParameterError(f"json_schema is not JSON: {exc}", field="json_schema") from None
        if not isinstance(value, dict | bool):
            raise InvalidParameterError("json_schema must be a JSON schema object", field="json_schema")
        depth = schema_depth(value)
        if depth > MAX_DEPTH:
            raise InvalidParameterError(
                f"the json_schema nests deeper than {MAX_DEPTH} levels (dicts and lists, a local $ref counting as "
                f"what it points at): llamaplug's bound for llguidance, whose compiler recurses once a level",
                field="json_schema")
        where = long_pattern(value)
        if where is not None:
            raise InvalidParameterError(
                f"the json_schema's pattern at {where} is longer than {MAX_PATTERN} characters: llamaplug's bound "
                f"for llguidance, whose lexer takes time growing with the square of a pattern's size",
                field="json_schema")
        # what LLMatcher.grammar_from_json_schema writes as JSON text, as a dict: no 128-level reader on the way
        return {"grammars": [{"json_schema": value}]}, field, depth <= INLINE_DEPTH
    if not isinstance(value, str):
        raise InvalidParameterError(f"{field} must be text", field=field)
    if field == "lark" or value.lstrip().startswith("%llguidance"):
        return llguidance.LLMatcher.grammar_from_lark(value), field, False
    try:
        return llguidance.grammar_from("gbnf", value), field, False
    except ValueError as exc:
        raise InvalidParameterError(f"llguidance cannot read the grammar: {exc}", field=field) from None


def compiled(tokenizer: Any, grammar: str | dict[str, Any], inline: bool = False) -> Any:
    """llguidance's matcher of `grammar`, compiled on a thread with COMPILE_STACK of stack (see the module's doc), or
    on this one where `inline`."""
    def matcher() -> Any:
        return llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=LIMITS)

    if inline:
        return matcher()
    done: dict[str, Any] = {}

    def compile_() -> None:
        try:
            done["matcher"] = matcher()
        except BaseException as exc:  # re-raised on the caller's thread
            done["error"] = exc

    with _lock:  # the stack size is the process's setting for the next thread started: ours only
        before = threading.stack_size(COMPILE_STACK)
        try:
            worker = threading.Thread(target=compile_, name="llguidance-compile", daemon=True)
            worker.start()
        except RuntimeError as exc:  # the stack could not be reserved (a low ulimit -v)
            raise SamplingError(f"llguidance's compile thread did not start with {COMPILE_STACK >> 20} MiB of "
                                f"stack: {exc}") from None
        finally:
            threading.stack_size(before)
    worker.join()
    if "error" in done:
        raise done["error"]
    return done["matcher"]


class LLGuidanceSampler:
    """A Python sampler (apply / accept / reset) whose candidates are those llguidance's matcher allows."""

    def __init__(self, model: Any, grammar: str | dict[str, Any], field: str, inline: bool = False):
        self.tokenizer = tokenizer_for(model)
        self.n_vocab = model.n_vocab
        self.field = field
        self.ends = frozenset(self.tokenizer.eos_tokens)
        self.matcher = compiled(self.tokenizer, grammar, inline)
        if self.matcher.is_error():
            # llguidance names what it refused: an unsupported keyword, a bad pattern, a Lark error
            raise InvalidParameterError(f"llguidance cannot take this {field}: {self.matcher.get_error()}",
                                        field=field)
        self.mask = llguidance.numpy.allocate_token_bitmask(1, self.n_vocab)

    def apply(self, candidates: Any) -> None:
        if self.matcher.is_error():
            raise SamplingError(f"llguidance's matcher failed: {self.matcher.get_error()}")
        ids = candidates.ids
        if ids.size <= FEW_CANDIDATES:
            # validate_tokens([t]) is 1 exactly where t's mask bit is set, but for an end token, which it
            # never commits: the mask allows those where the matcher is accepting
            refused = np.array([not 0 <= t < self.n_vocab or (not self.matcher.is_accepting() if t in self.ends
                                                             else self.matcher.validate_tokens([t]) != 1)
                                for t in ids.tolist()], dtype=bool)
            np.putmask(candidates.logits, refused, -np.inf)
            return
        llguidance.numpy.fill_next_token_bitmask(self.matcher, self.mask)
        # one byte per token (little-endian bit order is llguidance's), then one gather by the candidates' ids:
        # 2.8x faster than shifting the words per candidate, which mattered for Gemma's 262k vocabulary
        bits = np.unpackbits(self.mask[0].view(np.uint8), bitorder="little")
        if ids.size and int(ids.max()) < bits.size:
            refused = bits.take(ids) == 0
        else:
            refused = np.ones(ids.shape, dtype=bool)
            inside = ids < bits.size
            refused[inside] = bits[ids[inside]] == 0
        np.putmask(candidates.logits, refused, -np.inf)

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise SamplingError(f"llguidance's {self.field} does not allow token {token}: "
                                f"{self.matcher.get_error() or 'refused'}")

    def reset(self) -> None:
        self.matcher.reset()

    def clone(self) -> LLGuidanceSampler:
        twin = object.__new__(LLGuidanceSampler)
        twin.tokenizer, twin.n_vocab, twin.field, twin.ends = self.tokenizer, self.n_vocab, self.field, self.ends
        twin.matcher = self.matcher.deep_copy()
        twin.mask = self.mask.copy()
        return twin


def make_sampler(model: Any, json_schema: Any = None, lark: str | None = None,
                 grammar: str | None = None) -> LLGuidanceSampler:
    if model is None or not hasattr(model, "token_to_piece"):
        raise InvalidParameterError("the llguidance sampler needs model= (the LlamaModel it samples for: "
                                    "llama.model)", field="model")
    text, field, inline = grammar_of(json_schema, lark, grammar)
    return LLGuidanceSampler(model, text, field, inline)
