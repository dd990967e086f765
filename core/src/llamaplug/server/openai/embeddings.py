"""/v1/embeddings: one vector per input (a text, token ids, text with media, ...: embedding_inputs.py), as floats
or base64 (little-endian float32).

/embeddings (and /embedding) is llama-server's own, not OpenAI's: `content` (or `input`), in the same shapes,
gives [{"index", "embedding": [vector]}], each vector nested in a list as llama-server
nests it (one row per token with pooling none).

An input with media (a server with --mmproj) is made into the projector's prompt (high/embeddings.media_prompt)
and pooled as llama-server pools it: the vector of the text after the last media, which attends to the media.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import Depends, Request

from ...high.embeddings import media_prompt
from ..deps import served_model
from ..dialects import NATIVE, OPENAI
from ..errors import ERROR_RESPONSES, BadRequestError
from ..native.schemas import NativeEmbeddingRequest
from ..registry import Served
from ..request_limits import check_inputs
from ..streaming import off_loop
from .embedding_inputs import MediaInput, Prompt, embedding_prompts
from .schemas import Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage

router = OPENAI.router()
native_router = NATIVE.router()  # llama-server's own spellings: its error shape


@router.post("/v1/embeddings", response_model=EmbeddingList, responses=ERROR_RESPONSES)
async def embeddings(body: EmbeddingRequest, request: Request,
                     served: Annotated[Served, Depends(served_model(EmbeddingRequest))]) -> Any:
    if served.pooling == "none":  # llama-server's refusal: OpenAI's shape has one vector per input
        raise BadRequestError("pooling none (serve --pooling none) gives a vector per token, which /v1/embeddings "
                              "cannot return: use /embeddings, or another --pooling", param="input")
    llama = served.llama
    texts = _prompts(served, body.input, "input")
    check_inputs(request, _counted(texts), "input")

    def work() -> tuple[Any, int]:
        prompts = _with_media(served, texts)
        vectors = llama.embed(prompts, pooling=served.pooling)
        return vectors, sum(len(llama.tokenize(t)) if isinstance(t, str) else len(t) if isinstance(t, list)
                            else int(t.n_pos) for t in prompts)  # media: the positions they take, as llama-server

    vectors, n_tokens = await off_loop(work, request)  # stops between inputs when the client leaves
    data = [Embedding(index=i, embedding=_encode(v, body.encoding_format)) for i, v in enumerate(vectors)]
    return EmbeddingList(data=data, model=served.id, usage=EmbeddingUsage(prompt_tokens=n_tokens,
                                                                          total_tokens=n_tokens))


def _prompts(served: Served, given: Any, field: str) -> list[Prompt]:
    llama = served.llama
    return embedding_prompts(given, lambda text, first: llama.tokenize(text, first), llama.projector is not None,
                             field)


def _counted(prompts: list[Prompt]) -> list[Any]:
    """What --max-inputs and --max-chars count: a media input's parts (their text; media fields are not counted)."""
    return [p.parts if isinstance(p, MediaInput) else p for p in prompts]


def _with_media(served: Served, prompts: list[Prompt]) -> list[Any]:
    """Each MediaInput as the projector's prompt (decoding its media: in the worker thread, off the event loop)."""
    return [media_prompt(served.llama, p.parts, p.where) if isinstance(p, MediaInput) else p for p in prompts]


def _encode(vector: Any, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.astype(float).tolist()


@native_router.post("/embeddings", responses=ERROR_RESPONSES)
async def native_embeddings(body: NativeEmbeddingRequest, request: Request,
                            served: Annotated[Served, Depends(served_model(NativeEmbeddingRequest))]) -> Any:
    field = "content" if body.content is not None else "input"
    given = body.content if body.content is not None else body.input
    if given is None:
        raise BadRequestError('"input" or "content" must be provided', param="content")
    texts = _prompts(served, given, field)
    check_inputs(request, _counted(texts), field)
    # per token (pooling none) the rows are the model's own, as llama-server returns them: not normalized
    normalize = served.pooling != "none"
    vectors = await off_loop(lambda: served.llama.embed(_with_media(served, texts), normalize,
                                                        pooling=served.pooling), request)
    return [{"index": i, "embedding": [_encode(v, "float")] if v.ndim == 1 else _encode(v, "float")}
            for i, v in enumerate(vectors)]


native_router.add_api_route("/embedding", native_embeddings, methods=["POST"], responses=ERROR_RESPONSES,
                     include_in_schema=False)
