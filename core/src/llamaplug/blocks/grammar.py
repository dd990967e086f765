"""Grammar: a GBNF grammar checked by llama.cpp's own parser, for the grammar samplers.

    g = Grammar.from_string('root ::= "yes" | "no"')
    chain = SamplerChain().grammar(g).dist(1)

llama.cpp's parser reports a syntax error on stderr (not through its log callback)
and returns NULL; the text is captured here and becomes an `InvalidGrammarError`
with the line, the column and llama.cpp's reason.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..errors import InvalidGrammarError, InvalidParameterError
from ..raw import ffi, lib
from . import _native_log
from ._stderr import captured_stderr as _captured_stderr
from ._text import encode_text
from .grammar_bounds import check_bounds


def _position(source: str, offset: int) -> tuple[int, int]:
    before = source[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def _reason(source: str, printed: str) -> tuple[str, int | None, int | None]:
    """llama.cpp's reason, and where: its messages end "at <the rest of the grammar>"."""
    marker = "error parsing grammar: "
    text = printed[printed.find(marker) + len(marker):] if marker in printed else printed
    echo = text.find("\n\n" + source + "\n")  # the parser prints the grammar after its reason
    if echo >= 0:
        text = text[:echo]
    reason, sep, rest = text.strip().partition(" at ")
    body = source.rstrip()
    if sep and rest and body.endswith(rest):
        line, column = _position(source, len(body) - len(rest))
        return reason, line, column
    if text.strip().endswith(" at"):  # nothing left: the parser points at the end of the grammar
        line, column = _position(source, len(body))
        return f"{text.strip()[:-3]} at the end of the grammar", line, column
    text = text.strip()
    reason = text.splitlines()[0] if text else "llama.cpp gave no reason"
    undefined = re.fullmatch(r"Undefined rule identifier '(.+)'", reason)
    if undefined:  # llama.cpp says which name, not where: its first use
        offset = _first_use(source, undefined[1])
        if offset is not None:
            return reason, *_position(source, offset)
    return reason, None, None


_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*|[a-zA-Z0-9_-]+')


def _first_use(source: str, name: str) -> int | None:
    """The offset of the first reference to rule `name` (not inside a literal, a class or a comment)."""
    for token in _TOKEN.finditer(source):
        if token[0] == name and not source[token.end():].lstrip(" \t").startswith("::="):
            return token.start()
    return None


class Grammar:
    """A GBNF grammar llama.cpp's parser accepted (token references `<[id]>` are checked when used)."""

    def __init__(self, source: str, root: str = "root", _checked: bool = False):
        self.source = source
        self.root = root
        if not _checked:
            check_grammar(source, root)

    @classmethod
    def from_string(cls, gbnf: str, root: str = "root") -> Grammar:
        return cls(gbnf, root)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], root: str = "root") -> Grammar:
        source = Path(path)
        try:
            text = source.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidGrammarError(f"cannot read grammar file {source}: {exc}", path=str(source)) from None
        try:
            return cls(text, root)
        except InvalidGrammarError as exc:
            raise InvalidGrammarError(f"{source}: {exc}", line=exc.line, column=exc.column, reason=exc.reason,
                                      path=str(source)) from None

    @classmethod
    def from_json_schema(cls, schema: Any) -> Grammar:
        """The grammar of the JSON texts `schema` accepts (llama.cpp's converter: json_schema.py)."""
        from .json_schema import schema_to_gbnf

        return cls(schema_to_gbnf(schema))

    def sampler_ptr(self, vocab: Any, lazy: bool = False, trigger_patterns: tuple[str, ...] = (),
                    trigger_tokens: tuple[int, ...] = ()) -> Any:
        """A new native grammar sampler for `vocab` (NULL-checked; the caller owns it)."""
        src, root = encode_text(self.source, "grammar"), encode_text(self.root, "root")
        with _captured_stderr() as printed, _native_log.capture_errors() as logged:
            if lazy:
                patterns = [ffi.new("char[]", encode_text(p, "trigger_patterns")) for p in trigger_patterns]
                c_patterns = ffi.new("const char *[]", patterns) if patterns else ffi.NULL
                c_tokens = ffi.new("llama_token[]", list(trigger_tokens)) if trigger_tokens else ffi.NULL
            else:
                c_patterns, patterns, c_tokens = ffi.NULL, [], ffi.NULL
            # Through the catching shim: a trigger pattern that is no valid regex throws std::regex_error.
            ptr = lib.llamaplug_sampler_init_grammar_checked(vocab, src, root, int(lazy), c_patterns, len(patterns),
                                                             c_tokens, len(trigger_tokens) if lazy else 0)
        if ptr == ffi.NULL:
            threw = ffi.string(lib.llamaplug_sampler_last_error()).decode("utf-8", "replace")
            if threw:
                what = "a trigger pattern or the grammar" if lazy else "the grammar"
                raise InvalidGrammarError(f"llama.cpp refused {what}: {threw}", reason=threw)
            raise _grammar_error(self.source, self.root, printed[0] if printed else "", logged)
        return ptr

    def __repr__(self) -> str:
        first = self.source.strip().splitlines()[0] if self.source.strip() else ""
        return f"<Grammar root={self.root!r} {first[:40]!r}>"


def _grammar_error(source: str, root: str, printed: str, logged: list[str]) -> InvalidGrammarError:
    if printed.strip():
        reason, line, column = _reason(source, printed)
        where = f" at line {line}, column {column}" if line is not None else ""
        return InvalidGrammarError(f"invalid grammar{where}: {reason}", line=line, column=column, reason=reason)
    reason = next((m for m in reversed(logged) if m != "failed to parse grammar"), None) or "llama.cpp refused it"
    return InvalidGrammarError(f"invalid grammar (root {root!r}): {reason}", reason=reason)


def check_grammar(source: str, root: str = "root") -> None:
    """Parse with llama.cpp (no vocabulary needed) and free the result; raise InvalidGrammarError."""
    if not isinstance(source, str) or not source.strip():
        raise InvalidParameterError("a grammar must be non-empty GBNF text", field="grammar")
    check_bounds(source)  # before llama.cpp's parser, which a deep grammar overflows (grammar_bounds.py)
    ptr = Grammar(source, root, _checked=True).sampler_ptr(ffi.NULL)
    lib.llama_sampler_free(ptr)
