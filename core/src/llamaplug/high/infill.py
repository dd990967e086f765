"""Fill-in-the-middle prompts from the model's own FIM tokens, laid out as llama.cpp's server lays them out.

    [FIM_REP]myproject\\n [FIM_SEP]file\\n text ... [FIM_SEP]filename\\n [FIM_PRE]prefix[FIM_SUF]suffix[FIM_MID]

(the repository part only where the vocabulary has those tokens; `spm=True` puts the
suffix first). A model without FIM tokens is an InvalidModelError naming the missing ones.
"""

from __future__ import annotations

from typing import Any

from ..blocks.model import LlamaModel
from ..errors import InvalidModelError, InvalidParameterError

# Between extra chunks where the vocabulary has no FIM_SEP: "\n\n--- snippet ---\n\n", as llama.cpp's server.
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"


def infill_tokens(model: LlamaModel, prefix: str, suffix: str, extra: list[dict[str, str]] | None = None,
                  spm: bool = False, project: str = "myproject") -> list[int]:
    pre, suf, mid = (model.special_token(n) for n in ("fim_pre", "fim_suf", "fim_mid"))
    missing = [n for n, t in (("FIM prefix", pre), ("FIM suffix", suf), ("FIM middle", mid)) if t is None]
    if missing:
        raise InvalidModelError(f"{model.path.name} has no {', '.join(missing)} token: it was not trained for "
                                "fill-in-the-middle (tokenizer.ggml.fim_*_token_id)")
    assert pre is not None and suf is not None and mid is not None
    rep, sep = model.special_token("fim_rep"), model.special_token("fim_sep")
    head: list[int] = []
    if rep is not None:
        head += [rep, *model.tokenize(f"{project}\n", False)]
    for i, chunk in enumerate(extra or []):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise InvalidParameterError(f"extra[{i}] must be {{'text': str, 'filename': str}}", field=f"extra[{i}]")
        if sep is not None:
            head += [sep, *model.tokenize(f"{chunk.get('filename', 'tmp')}\n", False)]
        else:
            head += model.tokenize(CHUNK_SEPARATOR, False)
        head += model.tokenize(chunk["text"], False)
    if sep is not None:
        head += [sep, *model.tokenize("filename\n", False)]
    first = [pre, *model.tokenize(prefix, False)]
    second = [suf, *model.tokenize(suffix, False)]
    if spm:
        first, second = second, first
    bos = [model.bos] if model.add_bos and model.bos is not None else []
    return head + bos + first + second + [mid]


def check_text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidParameterError(f"{field} must be a string, got {type(value).__name__}", field=field)
    return value
