"""POST /completion (and /completions): llama-server's own completion API, its request fields and response shape.

The prompt is text (special tokens parsed, as llama-server), token ids, both mixed, or a
list of such prompts (then a list of results). The response has llama-server's keys:
content, tokens, stop, stop_type, stopping_word, tokens_predicted, tokens_evaluated,
tokens_cached, timings, generation_settings, ... A stream is llama-server's: one
`data:` event per piece, the last with every key, and no [DONE].

`id_slot` in the response is -1: the engine picks the slot and does not say which.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from ..deps import served_model
from ..dialects import NATIVE
from ..errors import ERROR_RESPONSES, BadRequestError
from ..registry import Served
from ..shared import check_room, mixed_tokens, run
from ..streaming import off_loop
from .schemas import JsonPrompt, NativeCompletionRequest

router = NATIVE.router()


@router.post("/completion", responses=ERROR_RESPONSES)
async def completion(body: NativeCompletionRequest, request: Request,
                     served: Annotated[Served, Depends(served_model(NativeCompletionRequest))]) -> Any:
    given = [_unwrap(p, served) for p in split_prompts(body.prompt)]
    prompts = await off_loop(lambda: [prompt_tokens(served, p) for p in given], request)
    texts = [p if isinstance(p, str) else "" for p in given]
    return await run(request, served, body, prompts, texts)


# llama-server's other spelling of the same route (not OpenAI's /v1/completions); one operation in the document.
router.add_api_route("/completions", completion, methods=["POST"], include_in_schema=False,
                     responses=ERROR_RESPONSES)


def split_prompts(prompt: Any) -> list[Any]:
    """llama-server's prompt forms as a list of prompts: a list of texts or of id lists is several, else one."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        return prompt
    if isinstance(prompt, list) and any(isinstance(p, (list, JsonPrompt)) for p in prompt):
        if not all(isinstance(p, (str, list, JsonPrompt)) for p in prompt):
            raise BadRequestError('"prompt" elements must be a string, a list of tokens, a JSON object containing a '
                                  "prompt string, or a list of mixed strings & tokens.", param="prompt")
        return prompt
    return [prompt]


def _unwrap(prompt: Any, served: Served) -> Any:
    """A JsonPrompt's prompt_string (llama-server's prompt object); its multimodal_data is refused."""
    if not isinstance(prompt, JsonPrompt):
        return prompt
    if prompt.multimodal_data is not None:
        if served.llama.projector is None:  # llama-server's words
            raise BadRequestError("Multimodal data provided, but model does not support multimodal requests.",
                                  param="prompt.multimodal_data")
        raise BadRequestError("multimodal_data is not read on /completion: send images through /v1/chat/completions",
                              param="prompt.multimodal_data")
    return prompt.prompt_string


def prompt_tokens(served: Served, prompt: str | list[int | str]) -> list[int]:
    """One prompt's tokens (text tokenized with special tokens, as llama-server), refused if it outgrows a slot."""
    model = served.llama.model
    tokens = mixed_tokens([prompt] if isinstance(prompt, str) else prompt,
                          lambda text, first: model.tokenize(text, first, True))
    if not tokens:
        raise BadRequestError("the prompt has no tokens", param="prompt")
    check_room(served, tokens, "prompt")
    return tokens
