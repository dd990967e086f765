"""/v1/embeddings: one vector per input (a text, token ids, ...: embedding_inputs.py), as floats or base64
(little-endian float32).

/embeddings (and /embedding) is llama-server's own, not OpenAI's: `content` (or `input`)
gives [{"index", "embedding": [vector]}], each vector nested in a list as llama-server
nests it (one row per token with pooling none).
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import Depends, Request

from ..deps import served_model
from ..dialects import NATIVE, OPENAI
from ..errors import ERROR_RESPONSES, BadRequestError
from ..native.schemas import NativeEmbeddingRequest
from ..registry import Served
from ..request_limits import check_inputs
from ..streaming import off_loop
from .embedding_inputs import embedding_prompts
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
    texts = embedding_prompts(body.input, lambda text, first: llama.tokenize(text, first))
    check_inputs(request, texts, "input")

    def work() -> tuple[Any, int]:
        vectors = llama.embed(texts, pooling=served.pooling)
        return vectors, sum(len(llama.tokenize(t)) if isinstance(t, str) else len(t) for t in texts)

    vectors, n_tokens = await off_loop(work, request)  # stops between inputs when the client leaves
    data = [Embedding(index=i, embedding=_encode(v, body.encoding_format)) for i, v in enumerate(vectors)]
    return EmbeddingList(data=data, model=served.id, usage=EmbeddingUsage(prompt_tokens=n_tokens,
                                                                          total_tokens=n_tokens))


def _encode(vector: Any, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.astype(float).tolist()


@native_router.post("/embeddings", responses=ERROR_RESPONSES)
async def native_embeddings(body: NativeEmbeddingRequest, request: Request,
                            served: Annotated[Served, Depends(served_model(NativeEmbeddingRequest))]) -> Any:
    given = body.content if body.content is not None else body.input
    texts = [given] if isinstance(given, str) else given
    if not texts:
        raise BadRequestError('"content" must be a string or a non-empty list of strings', param="content")
    check_inputs(request, texts, "content" if body.content is not None else "input")
    # per token (pooling none) the rows are the model's own, as llama-server returns them: not normalized
    normalize = served.pooling != "none"
    vectors = await off_loop(lambda: served.llama.embed(texts, normalize, pooling=served.pooling), request)
    return [{"index": i, "embedding": [_encode(v, "float")] if v.ndim == 1 else _encode(v, "float")}
            for i, v in enumerate(vectors)]


native_router.add_api_route("/embedding", native_embeddings, methods=["POST"], responses=ERROR_RESPONSES,
                     include_in_schema=False)
