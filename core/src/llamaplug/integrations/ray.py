"""Scale-out on Ray Serve: replicas each holding one engine, behind one OpenAI-compatible ingress.

    from ray import serve
    from llamaplug.integrations.ray import build_app

    serve.run(build_app(LlamaParams("model.gguf", n_seq_max=4, n_ctx=4096), num_replicas=2))

Each `LlamaReplica` runs the server's own ASGI app (`server.app.create_app`) in its
process, so the routes, error shapes, streaming and API key are `llamaplug serve`'s.
The `Ingress` is a thin proxy: it forwards a request (asgi_bridge.Forwarded) to the
replica that the router (ray_router.py) picks from the prompt's first characters
(affinity.py), and streams the answer back with Serve's streaming handles. A replica
lost before anything was sent to the client is retried once on another; after
that, a 503 in OpenAI's shape (or, once a stream's status line is out, an error event
ending the stream). Ray restarts the lost replica.

Importing this module imports Ray (`pip install "llamaplug[ray]"`); nothing else in
llamaplug does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..errors import ClosedError, InvalidParameterError
from ..params import LlamaParams
from ..server.api_error import ApiError, ServerFaultError, UnavailableError
from ..server.shutdown import DEFAULT_GRACE
from .affinity import DEFAULT_CHARS, affinity_key
from .asgi_bridge import ASGIApp, Forwarded, Head, Lifespan, answer

log = logging.getLogger("llamaplug.integrations.ray")

# The replica that answered (response header); sent by a client, it pins the request to that replica.
REPLICA_HEADER = "x-llamaplug-replica"
# A replica lost in flight: the actor died or cannot be reached (Ray's errors; a task error is not one).
_LOST = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.RaySystemError)

_PINNED_TIMEOUT_S = 30.0
# What a client is told of a lost replica (Ray's exception, which names Ray's classes, goes to the log)
STOPPED = "the replica serving this request stopped"

AppFactory = Callable[[int], ASGIApp]  # n_threads -> the replica's ASGI app


@dataclasses.dataclass(frozen=True)
class LlamaAppFactory:
    """A replica's app: `params` loaded with the actor's CPUs as n_threads (unless params set it) and served."""

    params: LlamaParams
    model_id: str | None = None
    api_key: str | None = None
    pooling: str | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # create_app's other keywords

    def __call__(self, n_threads: int) -> ASGIApp:
        from ..server.app import create_app
        from ..server.model_specs import served_name
        from ..server.registry import load_warm

        params = self.params
        if "n_threads" not in params.model_fields_set:
            params = params.model_copy(update={"n_threads": n_threads})
        # named as `llamaplug serve` names a file (without .gguf), so a replica and a server list the same id
        model_id = self.model_id or served_name(Path(params.model_path).name)
        return create_app(load_warm(params), model_id=model_id, api_key=self.api_key, pooling=self.pooling,
                          **self.options)


class LlamaReplica:
    """One engine (one model, its slots), answering forwarded requests through the server's ASGI app."""

    async def __init__(self, make_app: AppFactory):
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
        self._app = await asyncio.to_thread(make_app, max(1, int(cpus)))
        self._lifespan = Lifespan(self._app)
        await self._lifespan.startup()
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._tag = ((REPLICA_HEADER.encode(), self.replica_id.encode()),)
        log.info("replica %s in pid %d, %s CPUs", self.replica_id, os.getpid(), cpus)

    async def forward(self, request: Forwarded, **route: str | None) -> AsyncIterator[Head | bytes]:
        """The app's answer: a Head, then body chunks (closing early is the client's disconnect).

        `route` (the affinity key, a pinned replica) is for the router, which reads the call's keywords.
        """
        async for item in answer(self._app, request, self._tag):
            yield item

    async def check_health(self) -> None:
        """Serve's health check: the app's own /health (a closed engine fails it, and Ray replaces the replica)."""
        async for item in answer(self._app, Forwarded("GET", "/health")):
            if isinstance(item, Head) and item.status != 200:
                raise RuntimeError(f"replica {self.replica_id}: /health answered {item.status}")

    async def __del__(self) -> None:
        await self._lifespan.shutdown()


class Ingress:
    """The HTTP entry: forwards each request to a replica (prefix affinity) and relays its answer."""

    def __init__(self, replicas: Any, affinity_chars: int = DEFAULT_CHARS, first_byte_timeout_s: float = 600.0):
        self._replicas = replicas.options(stream=True)
        self._chars = affinity_chars
        self._timeout = first_byte_timeout_s

    async def __call__(self, request: Request) -> Response:
        forwarded = Forwarded(request.method, request.url.path, request.url.query.encode(),
                              tuple(request.headers.raw), await request.body())
        route = {"affinity": affinity_key(forwarded.path, forwarded.body, self._chars),
                 "replica": request.headers.get(REPLICA_HEADER)}
        # A pinned replica that is gone would be waited for (Serve's router retries until it is back): not long.
        timeout = min(self._timeout, _PINNED_TIMEOUT_S) if route["replica"] else self._timeout
        for _ in range(2):  # one retry: nothing has reached the client yet
            stream = self._replicas.forward.remote(forwarded, **route)
            try:
                head, first = await asyncio.wait_for(_head_and_first_chunk(stream), timeout)
                if _is_event_stream(head):
                    return _relay(head, StreamingResponse(_rest(stream, first, forwarded.path),
                                                                status_code=head.status))
                body = first + b"".join([chunk async for chunk in stream])
                return _relay(head, Response(body, status_code=head.status))
            except _LOST as exc:
                stream.cancel()
                log.warning("request %s %s: replica lost (%s)", forwarded.method, forwarded.path, exc)
            except asyncio.TimeoutError:  # slow, not lost: another try would only wait as long again
                stream.cancel()
                return _error(UnavailableError(f"no answer began within {timeout:g} s", code="replica_timeout"))
            except asyncio.CancelledError:  # the client left while the replica worked: stop it
                stream.cancel()
                raise
            except ray.exceptions.RayError:  # the replica's own code failed: no other would do better
                stream.cancel()
                log.exception("request %s %s failed in its replica", forwarded.method, forwarded.path)
                return _error(ServerFaultError("the replica failed (the server's log says why)",
                                               code="replica_error"))
        return _error(UnavailableError(f"no replica could answer: {STOPPED}, and the one it was retried on too",
                                       code="replica_unavailable"))


async def _head_and_first_chunk(stream: Any) -> tuple[Head, bytes]:
    head = await stream.__anext__()
    if not _is_event_stream(head):
        return head, b""
    try:  # a stream's first event: a replica lost before it is retried like any other request
        return head, await stream.__anext__()
    except StopAsyncIteration:
        return head, b""


@functools.cache
def _dialects() -> Any:
    """The server's map of a path to its API's dialect (dialects.DialectMap over every route the app serves)."""
    from ..server.dialects import DialectMap
    from ..server.routers import ROUTERS

    return DialectMap(route for router in ROUTERS for route in router.routes)


async def _rest(stream: Any, first: bytes, path: str) -> AsyncIterator[bytes]:
    """A stream's chunks; a replica lost in the middle (or stopped: Serve ends the actor at its grace time) ends
    it with its API's error event (the status line is sent), as `llamaplug serve` ends one at shutdown."""
    try:
        if first:
            yield first
        async for chunk in stream:
            yield chunk
    except _LOST as exc:
        from ..server.dialects import OPENAI

        log.warning("stream %s: replica lost (%s)", path, f"{type(exc).__name__}: {exc}".splitlines()[0])
        lost = ClosedError(STOPPED)
        dialect = _dialects()(path)
        # OpenAI's streams end with [DONE]; Anthropic's, the Responses API's and llama-server's with their error
        yield (dialect.stream_error(lost) + ("data: [DONE]\n\n" if dialect is OPENAI else "")).encode()
    finally:
        stream.cancel()  # the client left (or the stream ended): the replica's task ends, its slot is free


def _is_event_stream(head: Head) -> bool:
    return (head.header("content-type") or "").startswith("text/event-stream")


def _relay(head: Head, response: Response) -> Response:
    own = [(k, v) for k, v in response.raw_headers if k in (b"content-length",)]
    response.raw_headers = [*head.headers, *own]
    return response


def _error(error: ApiError) -> Response:
    from ..server.dialects import OPENAI

    return OPENAI.response(error)


def _factory(source: LlamaParams | str | os.PathLike[str] | AppFactory, model_id: str | None, api_key: str | None,
             pooling: str | None, options: dict[str, Any]) -> AppFactory:
    if isinstance(source, LlamaParams):
        return LlamaAppFactory(source, model_id, api_key, pooling, options)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            raise InvalidParameterError(f"build_app({path}): a models directory needs a factory giving the "
                                        "replica's app (source=callable(n_threads) -> ASGI app)", field="source")
        return LlamaAppFactory(LlamaParams(path), model_id, api_key, pooling, options)
    if callable(source):
        return source
    raise InvalidParameterError(f"build_app: source is a LlamaParams, a GGUF path or a factory, not "
                                f"{type(source).__name__}", field="source")


def build_app(source: LlamaParams | str | os.PathLike[str] | AppFactory, *, num_replicas: int | str | None = 1,
              autoscaling_config: dict[str, Any] | None = None, ray_actor_options: dict[str, Any] | None = None,
              max_ongoing_requests: int | None = None, model_id: str | None = None, api_key: str | None = None,
              pooling: str | None = None, routing: str = "prefix", affinity_chars: int = DEFAULT_CHARS,
              first_byte_timeout_s: float = 600.0, app_options: dict[str, Any] | None = None,
              shutdown_timeout_s: float = DEFAULT_GRACE) -> serve.Application:
    """The Serve application: `num_replicas` (or `autoscaling_config`) replicas of one engine behind the ingress.

    `source`: the model's LlamaParams (or a GGUF path); each replica loads it with n_threads =
    its actor's CPUs (`ray_actor_options["num_cpus"]`, default 1) unless the params set n_threads.
    A callable `source(n_threads)` returning an ASGI app serves anything else (a models directory).
    `max_ongoing_requests` (default: the params' slots, n_seq_max) is when a replica counts as
    saturated: its requests then go to the least loaded one. `routing`: "prefix" (consistent
    hashing of the prompt's first `affinity_chars` characters) or "round_robin".
    `model_id`, `api_key`, `pooling` and `app_options` (its other keywords: n_predict, slot_save_path):
    as `create_app`'s. `shutdown_timeout_s`: a replica stopped (serve.delete, a scale-down) lets its running
    requests go on for up to this long (`serve --shutdown-timeout`; Serve's graceful_shutdown_timeout_s, its
    default 20 s), then Serve ends the actor and the ingress ends each stream it was serving with its API's
    error event (and [DONE] on OpenAI's).
    """
    if routing not in ("prefix", "round_robin"):
        raise InvalidParameterError(f"routing {routing!r}: one of 'prefix', 'round_robin'", field="routing")
    if autoscaling_config is not None:
        num_replicas = None
    actor = {"num_cpus": 1, **(ray_actor_options or {})}
    if max_ongoing_requests is None:
        max_ongoing_requests = source.n_seq_max if isinstance(source, LlamaParams) else 4
    replica = serve.deployment(LlamaReplica).options(
        num_replicas=num_replicas, autoscaling_config=autoscaling_config, ray_actor_options=actor,
        max_ongoing_requests=max_ongoing_requests, graceful_shutdown_timeout_s=shutdown_timeout_s,
        request_router_config=RequestRouterConfig(
            request_router_class="llamaplug.integrations.ray_router:PrefixAffinityRouter",
            request_router_kwargs={"mode": routing}))
    # The ingress only relays bytes: it takes no CPU from the replicas, and many requests at once.
    # Stopped with the replicas (serve.delete), it outlives their grace: it ends the streams they leave.
    ingress = serve.deployment(Ingress).options(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000,
                                                graceful_shutdown_timeout_s=shutdown_timeout_s + 10)
    return ingress.bind(replica.bind(_factory(source, model_id, api_key, pooling, app_options or {})), affinity_chars,
                        first_byte_timeout_s)


def app_from_args(args: dict[str, str]) -> serve.Application:
    """An app builder for Serve's own tools: `serve run llamaplug.integrations.ray:app_from_args model=M.gguf
    replicas=2`, or a RayService's `import_path` with these `args` (KubeRay). Keys: model (a GGUF path; required),
    replicas (1), threads (CPUs and threads a replica, 1), slots (4), ctx (KV positions a replica, 4096),
    alias, api_key, routing ("prefix")."""
    if "model" not in args:
        raise InvalidParameterError("app_from_args: `model` (a GGUF path) is required", field="model")
    params = LlamaParams(args["model"], n_ctx=int(args.get("ctx", 4096)), n_seq_max=int(args.get("slots", 4)))
    return build_app(params, num_replicas=int(args.get("replicas", 1)),
                     ray_actor_options={"num_cpus": float(args.get("threads", 1))}, model_id=args.get("alias"),
                     api_key=args.get("api_key"), routing=args.get("routing", "prefix"))


def run(params: LlamaParams, *, replicas: int, address: str | None, host: str, port: int,
        threads: int | None, model_id: str | None, api_key: str | None, pooling: str | None,
        app_options: dict[str, Any] | None = None, shutdown_timeout_s: float = DEFAULT_GRACE) -> None:
    """`llamaplug serve --ray`: the app on the cluster at `address` (None: a local one), until Ctrl-C or SIGTERM."""
    ray.init(address=address, log_to_driver=False)
    # ray.init gave the driver Ray's C SIGTERM handler: a stack dump, then an abort (exit 134, the streams cut without
    # their error event, a local instance's agents left running). SIGTERM stops as Ctrl-C does instead.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    serve.start(http_options={"host": host, "port": port})
    app = build_app(params, num_replicas=replicas, ray_actor_options={"num_cpus": threads or 1},
                    model_id=model_id, api_key=api_key, pooling=pooling, app_options=app_options,
                    shutdown_timeout_s=shutdown_timeout_s)
    try:
        serve.run(app, name="llamaplug", blocking=True)
    except KeyboardInterrupt:  # stopping is the way out: exit 0 once the replicas have ended their streams
        pass
    finally:
        with contextlib.suppress(Exception):  # a second signal here (a KeyboardInterrupt) leaves at once
            serve.delete("llamaplug")
