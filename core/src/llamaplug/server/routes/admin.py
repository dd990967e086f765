"""/health (for load balancers; needs no key) and /metrics (Prometheus text)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/metrics", response_class=PlainTextResponse)
async def prometheus(request: Request) -> str:
    return request.app.state.metrics.render()
