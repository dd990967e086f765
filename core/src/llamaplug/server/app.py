"""The OpenAI-compatible HTTP API over one Llama or several: every client's requests share an engine's batches.

Errors are in each API family's own shape (dialects.py; OpenAI's {"error": {"message", "type", "param",
"code"}} here): bad requests 400 (the field named in `param`), a missing or wrong key 401, an unknown
model 404, a failed decode or backend 500, a closed server or a full queue 503 (with Retry-After). A client
that goes away mid-request (streamed or not) cancels its request: its slot is free at the engine's next step.

The app is put together here: the middlewares (middleware.py: request counters, CORS, API key, JSON bodies),
the error dialect of each API family (dialects.py), and the routers of each family's package (routers.py), each
route finding its model through one dependency (deps.py) over app.state.models, the
registry that loads and unloads models (registry.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from ..high.llama import Llama
from ..high.model_card import hash_in_background
from . import dialects, error_docs
from . import media_path as media_path_rules
from .chat_settings import ChatSettings
from .cors import Cors
from .metrics import Metrics
from .middleware import CorsGuard, Counted, JsonBody, KeyGuard
from .native.props import props_of
from .registry import ModelRegistry, Served
from .response_store import ResponseStore
from .routers import ROUTERS

# bytes (serve's --max-body-mib): a long prompt or an image or two in base64. JSON parsing and the body's
# checks hold the event loop ~25 ms a MiB, and tokenizing a prompt takes ~25 MiB of memory a MiB of text.
DEFAULT_MAX_BODY = 8 * 2**20


def create_app(llama: Llama, model_id: str | None = None, api_key: str | None = None,
               pooling: str | None = None, n_predict: int = -1, slot_save_path: str | None = None,
               chat_template: str | None = None, chat: ChatSettings | None = None,
               max_body: int = DEFAULT_MAX_BODY, media_path: str | None = None) -> FastAPI:
    """The ASGI app serving `llama` (closed when the app shuts down).

    `pooling` for /v1/embeddings: default the model's own, and mean for a model that has
    none (a generative model: OpenAI's shape has one vector per input, not one per token).
    `n_predict`: tokens a request that gives no limit may generate, on every route (llama-server's -n;
    -1: until the end). `slot_save_path`: the folder of POST /slots' files (None: save/restore refused).
    `chat_template` overrides the GGUF's; `chat`: the server's chat defaults (--reasoning-format, ...).
    `max_body`: the bytes a request body may have (a longer one is a 413). `media_path`: the folder media
    `file://` URLs are read from (llama-server's --media-path; None: they are refused, media_path.py).
    """
    served = Served.of(llama, model_id, pooling, chat_template)
    if chat is not None:
        served.chat = chat
    app = create_app_for(ModelRegistry([served]), api_key, n_predict, slot_save_path, max_body,
                         media_path=media_path)
    app.state.llama = llama
    return app


def create_app_for(registry: ModelRegistry, api_key: str | None = None, n_predict: int = -1,
                   slot_save_path: str | None = None, max_body: int = DEFAULT_MAX_BODY, cors: Cors | None = None,
                   endpoint_slots: bool = True, webui: bool = True, endpoint_metrics: bool = True,
                   media_path: str | None = None) -> FastAPI:
    """The ASGI app serving the models of `registry`, each loaded when first asked for (closed at shutdown);
    the other arguments as create_app's. `cors`: llama-server's CORS flags (None: its defaults, cors.py);
    `endpoint_slots` False: /slots answers 501, as llama-server's --no-slots; `webui` False: no chat page
    (its paths answer 404, as llama-server's --no-webui); `endpoint_metrics` False: /metrics answers 501, as
    llama-server without --metrics (`llamaplug serve`'s default; an app made here serves it); `media_path` as
    create_app's (a path that is no folder: InvalidParameterError)."""
    media_dir = media_path_rules.media_dir(media_path)
    metrics = Metrics(registry.engines)
    registry.on_unload(metrics.retire)
    registry.on_sleep(lambda name, served: metrics.asleep(name, served.llama.engine))
    props_asleep: dict[str, dict[str, Any]] = {}  # a sleeping model's /props, read as it fell asleep

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for name in registry.names():  # a big model's sha256 (/api/tags' digest) before a client lists it
            hash_in_background(registry.params(name).model_path)
        registry.idle_from_now()
        yield
        await asyncio.to_thread(registry.close)

    # No redirect from a path with a trailing slash: Starlette's is built from the Host header, and was given
    # without the key under /static/ (llama-server has none either).
    app = FastAPI(title="llamaplug", summary="OpenAI-compatible API over llama.cpp", version=_version(),
                  lifespan=lifespan, redirect_slashes=False)
    app.state.metrics = metrics
    app.state.models = registry
    app.state.n_predict = n_predict
    app.state.slot_save_path = slot_save_path
    app.state.media_path = media_dir  # (its real path: the folder file:// URLs must stay in)
    app.state.endpoint_slots = endpoint_slots
    app.state.endpoint_metrics = endpoint_metrics
    app.state.webui = webui
    app.state.props_asleep = props_asleep
    registry.on_sleep(lambda name, served: props_asleep.__setitem__(name, props_of(app.state, served)))
    # /v1/responses' kept responses: this process's only; `llamaplug serve` puts them in a file (--responses-db)
    app.state.responses = ResponseStore()
    # (the last added runs first)
    app.add_middleware(JsonBody, max_body=max_body)
    app.add_middleware(KeyGuard, api_key=api_key)
    app.add_middleware(CorsGuard, cors=cors or Cors())
    app.add_middleware(Counted, metrics=metrics)
    for router in ROUTERS:
        app.include_router(router)
    dialects.install(app, ROUTERS)
    error_docs.install(app)

    return app


def _version() -> str:
    from .. import __version__

    return __version__
