"""Ollama's model routes: /api/tags, /api/show, /api/ps, /api/version, /api/pull, /api/copy, DELETE /api/delete.

The models are the served ones (-m, --models-dir, and those pulled or copied here). An
Ollama client names a model `name`, `name:tag` or `name:latest`: a served id or alias,
with ":latest" (and a file's ".gguf") optional; /api/tags lists each as Ollama lists its own,
with a tag (":latest" where the name has none). An unknown name is Ollama's 404,
{"error": "model '...' not found"}, as every error here is {"error": "..."}.

/api/pull downloads "org/repo[:TAG]" (or "hf.co/org/repo[:TAG]", as Ollama pulls from the
Hugging Face Hub) through the hub loader into the Hub's cache, streaming Ollama's progress
lines, then serves it under that name (loaded on its first request, with the settings of the
server's first model). /api/copy adds a name; /api/delete removes a name, or a model with all
of its names (unloading it): files are never deleted from here (`llamaplug rm` deletes cached ones).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import Response, StreamingResponse

from ... import __version__
from ...errors import LlamaError
from ...high import hub
from ...high.chat import template_source
from ...high.model_card import ModelCard, card
from ..api_error import BadRequestError, ServerFaultError
from ..deps import models as served_models
from ..dialects import OLLAMA
from ..errors import ApiError
from ..model_specs import served_name
from ..registry import ModelRegistry, ModelSpec
from .common import ERRORS, iso, ndjson, resolve
from .schemas import CopyRequest, ModelName, PullRequest

# The Ollama release whose API this mirrors (its api/types.go and docs/api.md): what /api/version says, since
# clients compare it with the Ollama versions that added what they use.
OLLAMA_API_VERSION = "0.13.0"
_NEVER = "9999-12-31T23:59:59Z"  # /api/ps's expires_at of a model no timer unloads


OllamaRoute = OLLAMA.route_class  # a route whose errors, a body that does not fit included, are Ollama's


router = OLLAMA.router()
log = logging.getLogger("llamaplug.server.ollama")


def listed(name: str) -> str:
    """A name as Ollama lists it: without a file's ".gguf" (an alias may have one), with a tag."""
    name = served_name(name)
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


async def model_card(registry: ModelRegistry, ident: str) -> ModelCard:
    """The card of a served model's file (read off the event loop: a big vocabulary takes a moment).

    A file that does not read (changed since the server started) is a 500 that names the model only: the
    reason, which names the server's path and quotes the file's bytes, goes to the server's log."""
    path = registry.params(ident).model_path
    try:
        return await asyncio.to_thread(card, path)
    except LlamaError as exc:
        log.error("model %r: its file does not read: %s", ident, exc)
        raise ServerFaultError(f"model '{ident}': its file {Path(path).name} cannot be read as a GGUF model "
                               "(the server's log says why)", param="model", code="model_unreadable") from None


async def digest(ident: str, c: ModelCard) -> str:
    """The file's sha256, as Ollama lists a model's digest: hashed off the event loop, once per file (a big one
    from the server's start: high/model_card.py's hash_in_background); a file gone since is model_card's 500."""
    try:
        return await asyncio.to_thread(lambda: c.digest)
    except OSError as exc:
        log.error("model %r: its file does not read: %s", ident, exc)
        raise ServerFaultError(f"model '{ident}': its file {c.path.name} cannot be read (the server's log says "
                               "why)", param="model", code="model_unreadable") from None


def details(c: ModelCard) -> dict[str, Any]:
    return {"parent_model": "", "format": "gguf", "family": c.family, "families": [c.family],
            "parameter_size": c.parameter_size, "quantization_level": c.quantization}


@router.get("/api/version")
async def version() -> dict[str, str]:
    return {"version": OLLAMA_API_VERSION, "llamaplug": __version__}


@router.get("/api/tags", responses=ERRORS)
async def tags(registry: Annotated[ModelRegistry, Depends(served_models)]) -> dict[str, Any]:
    out = []
    for ident in registry.names():
        try:
            c = await model_card(registry, ident)
            sha256 = await digest(ident, c)
        except ApiError:  # (logged) one unreadable file leaves the others listed
            continue
        for name in (ident, *registry.describe(ident)[3]):
            out.append({"name": listed(name), "model": listed(name), "modified_at": iso(c.modified), "size": c.size,
                        "digest": sha256, "details": details(c)})
    return {"models": out}


@router.get("/api/ps", responses=ERRORS)
async def ps(registry: Annotated[ModelRegistry, Depends(served_models)]) -> dict[str, Any]:
    out = []
    for served in registry:
        c = await model_card(registry, served.id)
        left = registry.expires_in(served.id)
        sha256 = await digest(served.id, c)
        out.append({"name": listed(served.id), "model": listed(served.id), "size": c.size, "digest": sha256,
                    "details": details(c), "expires_at": _NEVER if left is None else iso(time.time() + left),
                    "size_vram": 0, "context_length": served.llama.engine.n_ctx_seq})
    return {"models": out}


@router.post("/api/show", responses=ERRORS)
async def show(body: ModelName, registry: Annotated[ModelRegistry, Depends(served_models)]) -> dict[str, Any]:
    ident = resolve(registry, body.which())
    c = await model_card(registry, ident)
    meta = c.metadata(arrays=body.verbose)
    template = c.chat_template or ""
    # capabilities from the template the server renders with (models.toml's, --chat-template), as a chat request
    override = registry.chat_template(ident)
    served_template = template_source(override) if override is not None else template
    license_ = meta.get("general.license")
    # FROM the model's name, where Ollama writes its blob's path: a client learns nothing of the server's disk
    return {"license": license_ if isinstance(license_, str) else "",
            "modelfile": f"# served by llamaplug {__version__}\nFROM {listed(ident)}\n", "parameters": "",
            "template": template, "details": details(c) | {"context_length": c.context_length,
                                                             "embedding_length": c.embedding_length},
            "model_info": meta, "capabilities": c.capabilities(registry.multimodal(ident), served_template),
            "modified_at": iso(c.modified)}


@router.post("/api/copy", responses=ERRORS)
async def copy(body: CopyRequest, registry: Annotated[ModelRegistry, Depends(served_models)]) -> Response:
    ident = resolve(registry, body.source)
    alias = body.destination.removesuffix(":latest")
    problem = alias_problem(alias)
    if problem is not None:
        raise BadRequestError(f"destination: {problem}", param="destination")
    registry.add_alias(ident, alias)
    return Response(status_code=200)


MAX_ALIAS = 255  # characters: as a file name may have


def alias_problem(alias: str) -> str | None:
    """Why `alias` cannot be a model's name (None: it can): a name stays a plain word that logs, file names and
    URLs take as it is, without a path separator, "..", a control character (NUL included) or an edge space."""
    if not alias:
        return "the name is empty"
    if len(alias) > MAX_ALIAS:
        return f"the name has {len(alias)} characters, more than {MAX_ALIAS}"
    if any(c in "/\\" for c in alias):
        return "the name has a path separator (/ or \\)"
    if ".." in alias:
        return 'the name has ".."'
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in alias):
        return "the name has a control character"
    if alias != alias.strip():
        return "the name begins or ends with a space"
    return None


@router.delete("/api/delete", responses=ERRORS)
async def delete(body: ModelName, registry: Annotated[ModelRegistry, Depends(served_models)]) -> Response:
    given = body.which()
    ident = resolve(registry, given)
    names = (ident, *registry.describe(ident)[3])
    name = next((n for n in dict.fromkeys((given, given.removesuffix(":latest"))) if n in names), ident)
    await registry.remove(name)
    return Response(status_code=200)


def hub_ref(name: str) -> tuple[str, str | None, str]:
    """(repo, tag or None, the name it is served under) of a pull's `name`; a 400 if it names no Hub model."""
    served = name.removesuffix(":latest")
    bare = served
    for host in ("hf.co/", "huggingface.co/", "https://huggingface.co/"):
        bare = bare.removeprefix(host)
    ref = hub.parse_ref(bare)
    if ref is None:
        raise BadRequestError(f"{name!r} names no Hugging Face model: pull org/repo[:TAG] (or "
                              "hf.co/org/repo[:TAG]); Ollama's own library is not reachable from here", param="model")
    return ref[0], ref[1], served


@router.post("/api/pull", responses=ERRORS)
async def pull(body: PullRequest, request: Request) -> Any:
    registry: ModelRegistry = served_models(request)
    repo, tag, name = hub_ref(body.which())
    if not body.stream:
        async for line in _pulling(registry, repo, tag, name):
            if "error" in line:
                raise BadRequestError(line["error"], param="model")
        return {"status": "success"}
    return StreamingResponse(ndjson(_pulling(registry, repo, tag, name)), media_type="application/x-ndjson")


async def _pulling(registry: ModelRegistry, repo: str, tag: str | None, name: str) -> AsyncIterator[dict[str, Any]]:
    """Ollama's pull progress: the manifest, each file's bytes, then success (or {"error"}, the last line)."""
    yield {"status": "pulling manifest"}
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[hub.Progress | None] = asyncio.Queue()

    def report(p: hub.Progress) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, p)

    async def fetch() -> Any:
        try:
            return await asyncio.to_thread(hub.download, repo, tag=tag, progress=report)
        finally:
            queue.put_nowait(None)

    task = asyncio.ensure_future(fetch())
    try:
        while (p := await queue.get()) is not None:
            digest = p.digest or p.file
            yield {"status": f"pulling {digest[:12]}", "digest": f"sha256:{digest}", "total": p.total,
                   "completed": p.completed}
        path = await task
    except LlamaError as exc:
        yield {"error": str(exc)}
        return
    finally:
        task.cancel()
    yield {"status": "verifying sha256 digest"}
    yield {"status": "writing manifest"}
    try:
        resolve(registry, name)
    except ApiError:  # new here: served from now on, with the first model's settings
        base = registry.params(registry.names()[0])
        registry.add(ModelSpec(name, base.model_copy(update={"model_path": path, "mmproj_path": None})))
    yield {"status": "success"}
