"""llamaplug plugin: Hugging Face `tokenizers` as a model's tokenizer, and a GGUF -> tokenizer.json exporter.

``LlamaParams(path, tokenizer="hf:/path/to/tokenizer.json")`` (or "hf:" + a folder holding one, or a
``tokenizers.Tokenizer``) makes the model tokenize and detokenize with it, once its vocabulary
has been checked against the model's. ``llamaplug tokenizer export MODEL.gguf -o tokenizer.json``
(``export.export_json``) writes a tokenizer.json that gives llama.cpp's tokens.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llamaplug
from llamaplug.plugin_api import Command, lazy_names

if TYPE_CHECKING:
    from .attached import HFTokenizer, load_tokenizer

__all__ = ["HFTokenizer", "load_tokenizer", "attach"]


# Imported when first asked for: the plugin manager imports this package in every llamaplug process, and
# `tokenizers` (3 MiB resident) is needed only by a model given tokenizer="hf:...".
__getattr__, __dir__ = lazy_names(__name__, {".attached": ("HFTokenizer", "load_tokenizer")}, globals())


def attach(source: Any, model: Any) -> HFTokenizer | None:
    """The `load` registered as "hf": a path (file or folder) or a tokenizers.Tokenizer; None for anything else."""
    from tokenizers import Tokenizer

    from .attached import HFTokenizer, load_tokenizer

    if isinstance(source, Tokenizer):
        tok = HFTokenizer(source, "the tokenizers.Tokenizer")
    elif isinstance(source, str | Path):
        tok = HFTokenizer(load_tokenizer(source), str(source))
    else:
        return None
    tok.check_against(model)
    return tok


@llamaplug.hookimpl
def llamaplug_register_tokenizers(register: Callable[[str, Callable[..., Any]], None]) -> None:
    register("hf", attach)


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="GGUF file (a vocab-only GGUF will do)")
    parser.add_argument("-o", "--output", default="tokenizer.json", help="file or folder to write")


def _export(args: argparse.Namespace) -> int:
    from .export import export_json

    out = export_json(args.model, args.output)
    print(f"wrote {out}", file=sys.stderr)
    return 0


@llamaplug.hookimpl
def llamaplug_register_commands(register: Callable[[Command], None]) -> None:
    register(Command("tokenizer export", _export, _export_arguments,
                     "write a tokenizer.json that tokenizes as llama.cpp does with the GGUF's vocabulary"))
