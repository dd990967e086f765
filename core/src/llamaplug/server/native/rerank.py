"""POST /v1/rerank (and /rerank, /reranking, /v1/reranking): llama-server's rerank, Jina/Cohere's shape.

`documents` gives {"model", "object", "usage", "results": [{"index", "relevance_score"}]},
best first, cut to `top_n`; `texts` in their place gives the TEI shape, a bare list of
{"index", "score"} (with "text" when return_text). The model must be a reranker (rank
pooling); another is a 400 saying so (llama-server: 501 unless started with --reranking).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends

from ...high.embeddings import rerank_tokens
from ..deps import served_model
from ..dialects import NATIVE
from ..errors import ERROR_RESPONSES, BadRequestError
from ..registry import Served
from .schemas import RerankRequest

router = NATIVE.router()


@router.post("/v1/rerank", responses=ERROR_RESPONSES)
async def rerank(body: RerankRequest, served: Annotated[Served, Depends(served_model(RerankRequest))]) -> Any:
    tei = body.texts is not None
    documents = body.documents if body.documents is not None else body.texts
    if not documents:
        raise BadRequestError('"documents" must be a non-empty string array', param="documents")
    scores = await served.allama.rerank(body.query, documents)
    model = served.llama.model
    n_tokens = sum(len(rerank_tokens(model, body.query, d)) for d in documents)
    label = "score" if tei else "relevance_score"
    ranked = sorted(({"index": i, label: float(s)} for i, s in enumerate(scores)), key=lambda r: -r[label])
    ranked = ranked[: body.top_n if body.top_n is not None else len(ranked)]
    if tei:
        return [{**r, "text": documents[r["index"]]} if body.return_text else r for r in ranked]
    return {"model": body.model or served.id, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "results": ranked}


for alias in ("/rerank", "/reranking", "/v1/reranking"):  # llama-server's other spellings, listed once
    router.add_api_route(alias, rerank, methods=["POST"], include_in_schema=False, responses=ERROR_RESPONSES)
