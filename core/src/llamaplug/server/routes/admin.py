"""/health (for load balancers; needs no key) and /metrics (Prometheus text, llama-server's names included)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import PlainTextResponse

from ..dialects import OPENAI

router = OPENAI.router()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


# llama-server's spelling; the OpenAPI document lists /health once.
router.add_api_route("/v1/health", health, methods=["GET"], include_in_schema=False)


@router.get("/metrics", response_class=PlainTextResponse)
async def prometheus(request: Request) -> str:
    return request.app.state.metrics.render()
