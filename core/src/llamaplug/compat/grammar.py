"""llama-cpp-python's LlamaGrammar over llamaplug's Grammar (GBNF checked by llama.cpp's parser when made)."""

from __future__ import annotations

import json
import os
from typing import Any

from llamaplug import Grammar, InvalidGrammarError

LLAMA_GRAMMAR_DEFAULT_ROOT = "root"


class LlamaGrammar:
    """A GBNF grammar for `grammar=` of completions: `from_string`, `from_file`, `from_json_schema`.

    Unlike llama-cpp-python, a grammar that does not parse is an InvalidGrammarError (a ValueError)
    with its line and column when it is made, not when it is first used.
    """

    def __init__(self, *args: Any, _grammar: str, **kwargs: Any):
        self.grammar = Grammar.from_string(_grammar, LLAMA_GRAMMAR_DEFAULT_ROOT)
        self._grammar = _grammar
        self._root = LLAMA_GRAMMAR_DEFAULT_ROOT

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        return cls(_grammar=grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> LlamaGrammar:
        return cls._of(Grammar.from_file(file))

    @classmethod
    def from_json_schema(cls, json_schema: str | dict[str, Any], verbose: bool = True) -> LlamaGrammar:
        """The grammar of JSON texts that `json_schema` (a JSON string, as llama-cpp-python takes, or a dict) accepts.

        llamaplug's converter: a keyword it cannot express exactly is an UnsupportedSchemaError.
        """
        if isinstance(json_schema, (str, bytes)):
            try:
                json_schema = json.loads(json_schema)
            except ValueError as exc:
                raise InvalidGrammarError(f"json_schema is not JSON: {exc}", reason=str(exc)) from None
        return cls._of(Grammar.from_json_schema(json_schema))

    @classmethod
    def _of(cls, grammar: Grammar) -> LlamaGrammar:
        made = cls.__new__(cls)
        made.grammar, made._grammar, made._root = grammar, grammar.source, grammar.root
        return made

    def __repr__(self) -> str:
        return f"<LlamaGrammar {self.grammar!r}>"
