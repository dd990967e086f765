"""llamaplug plugin: Hugging Face `tokenizers` as a model's tokenizer, and a GGUF -> tokenizer.json exporter.

``LlamaParams(path, tokenizer="hf:/path/to/tokenizer.json")`` (or "hf:" + a folder holding one, or a
``tokenizers.Tokenizer``) makes the model tokenize and detokenize with it, once its vocabulary
has been checked against the model's. ``llamaplug tokenizer export MODEL.gguf -o tokenizer.json``
(``export.export_json``) writes a tokenizer.json that gives llama.cpp's tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import llamaplug

from .attached import HFTokenizer, load_tokenizer

__all__ = ["HFTokenizer", "load_tokenizer", "attach"]


def attach(source: Any, model: Any) -> HFTokenizer | None:
    """The `load` registered as "hf": a path (file or folder) or a tokenizers.Tokenizer; None for anything else."""
    from tokenizers import Tokenizer

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
