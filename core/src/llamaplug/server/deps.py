"""The dependency that gives a route its model: the request body's `model`, through app.state.models.

    @router.post("/v1/things")
    async def things(body: ThingRequest, served: Annotated[Served, Depends(served_model(ThingRequest))]): ...

The dependency declares the route's own body parameter (`body`, of the same type):
FastAPI takes the two for one body, so the OpenAPI document is the route's, a body
that does not fit is a 400 before any model is looked up, and an unknown model is a
404 before the route runs. It holds a lease on the model (loading it if need be) until
the response is sent, a stream's last event included, so the model is not unloaded
under the request; the body's `keep_alive` (Ollama's) becomes the model's. A request
waiting for its model's load stops waiting when its client goes away (a 499), and a load
nobody waits for any more is called off (registry.lease's `gone`).
"""

# Without `from __future__ import annotations`: FastAPI reads `body`'s annotation at run time, and here it is a
# variable.

import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from fastapi import Request

from .registry import ModelRegistry, Served, parse_keep_alive
from .streaming import disconnected


class NamesAModel(Protocol):
    model: str | None


def client_gone(request: Request) -> Callable[[], Awaitable[None]]:
    """What a lease waits on to stop waiting for its model's load: the request's client going away."""
    return functools.partial(disconnected, request)


def served_model(body_type: type[NamesAModel]) -> Callable[..., AsyncIterator[Served]]:
    """The dependency resolving the model that a `body_type` body names."""

    async def resolve(request: Request, body: body_type) -> AsyncIterator[Served]:  # type: ignore[valid-type]
        keep_alive = parse_keep_alive(getattr(body, "keep_alive", None))
        async with models(request).lease(body.model, keep_alive, client_gone(request)) as served:
            # The reply names the model as the request did (an alias, an id without .gguf), as llama-server does.
            yield served if not body.model or body.model == served.id else dataclasses.replace(served, id=body.model)

    return resolve


async def queried_model(request: Request, model: str | None = None) -> AsyncIterator[Served]:
    """For routes without a body (GET /props, /slots): the model named by `?model=` (llama-server's router
    mode), else the default one, leased as `served_model` leases it."""
    async with models(request).lease(model, gone=client_gone(request)) as served:
        yield served


def token_limit(request: Request, asked: int | None) -> int | None:
    """The tokens a request may generate: its own limit, else the server's -n/--n-predict (as llama-server,
    the default of every route), else None (until the slot is full)."""
    if asked is not None:
        return asked
    default: int = getattr(request.app.state, "n_predict", -1)
    return None if default < 0 else default


class AsksVerbose(Protocol):
    verbose: bool
    model_fields_set: set[str]


def verbose(request: Request, body: AsksVerbose) -> bool:
    """Whether a reply carries llama-server's `__verbose`: the request's `verbose`, else the server's --verbose (as
    llama-server, whose every request defaults to it then)."""
    if "verbose" in body.model_fields_set:
        return body.verbose
    return bool(getattr(request.app.state, "verbose", False))


def models(request: Request) -> ModelRegistry:
    """The app's served models."""
    registry: ModelRegistry = request.app.state.models
    return registry
