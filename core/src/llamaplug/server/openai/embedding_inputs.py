"""/v1/embeddings' `input` in every shape llama-server takes (its tokenize_input_prompts), as prompts for
Llama.embed: each a text or a list of token ids.

- "text", or a list of texts: one prompt each;
- token ids [12, 34, 56], or ids and texts mixed [12, "text", 34]: one prompt (a text in it is tokenized, with the
  model's special tokens only when it comes first, as llama-server's tokenize_mixed);
- a list of such prompts: [[12, 34], "text", ...];
- {"prompt_string": "text"}, or {"content": [{"type": "text", "text": ...}, ...]} (OpenAI's content parts, the
  texts joined): one prompt, alone or in a list.

Media (multimodal_data, image/audio/video parts) are refused: a 400 naming where, as for a model without a
projector in llama-server.
"""

from __future__ import annotations

from typing import Any

from ..errors import BadRequestError
from ..shared import mixed_tokens

Prompt = str | list[int]


def embedding_prompts(given: Any, tokenize: Any) -> list[Prompt]:
    """The prompts of `given` (the request's `input`); `tokenize(text, add_special)` reads a text of a mixed one."""
    if isinstance(given, list) and not _has_ids(given):
        if not given:
            raise BadRequestError('"input" must not be empty', param="input")
        return [_prompt(item, f"input[{i}]", tokenize) for i, item in enumerate(given)]
    return [_prompt(given, "input", tokenize)]


def _has_ids(value: list[Any]) -> bool:
    return any(_is_id(v) for v in value)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompt(item: Any, where: str, tokenize: Any) -> Prompt:
    if isinstance(item, str):
        return item
    if isinstance(item, list):
        if not item or not all(_is_id(v) or isinstance(v, str) for v in item):
            raise BadRequestError(f"{where} must be token ids and texts", param=where)
        if all(_is_id(v) for v in item):
            return list(item)
        return mixed_tokens(item, tokenize)
    if isinstance(item, dict):
        if "content" in item:
            return _content_text(item["content"], f"{where}.content")
        if "multimodal_data" in item:
            raise BadRequestError(f"{where}.multimodal_data: this model takes no media (it has no projector)",
                                  param=where)
        if isinstance(item.get("prompt_string"), str):
            return item["prompt_string"]
    raise BadRequestError(f"{where} must be a text, token ids, {{\"prompt_string\": ...}} or {{\"content\": [...]}}",
                          param=where)


def _content_text(parts: Any, where: str) -> str:
    if not isinstance(parts, list):
        raise BadRequestError(f"{where} must be a list of content parts", param=where)
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("image_url", "input_audio", "input_video"):
            raise BadRequestError(f"{where}[{j}]: {kind} needs a model with a projector", param=f"{where}[{j}]")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise BadRequestError(f"{where}[{j}] must be a text part", param=f"{where}[{j}]")
        texts.append(part["text"])
    return "".join(texts)
