"""/health (for load balancers; needs no key) and /metrics (Prometheus text, llama-server's names included)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import PlainTextResponse

from .api_error import NotSupportedError, UnavailableError
from .deps import models
from .dialects import OPENAI
from .errors import ERROR_RESPONSES

router = OPENAI.router()


@router.get("/health", responses={503: ERROR_RESPONSES[503]})
async def health(request: Request) -> dict[str, str]:
    """200 while every model that should serve can; 503 (as llama-server while it loads) while one is being
    loaded again because its engine stopped."""
    down = models(request).down()
    if down:
        raise UnavailableError(f"model {down[0]!r} is loading again: its engine stopped", "unavailable_error",
                               code="model_reloading")
    return {"status": "ok"}


# llama-server's spelling; the OpenAPI document lists /health once.
router.add_api_route("/v1/health", health, methods=["GET"], include_in_schema=False)


@router.get("/metrics", response_class=PlainTextResponse)
async def prometheus(request: Request) -> PlainTextResponse:
    if not getattr(request.app.state, "endpoint_metrics", True):  # `serve` without --metrics, as llama-server
        raise NotSupportedError("This server does not support metrics endpoint. Start it with `--metrics`")
    metrics = request.app.state.metrics
    return PlainTextResponse(metrics.render(), headers={"Process-Start-Time-Unix": str(metrics.started)})
