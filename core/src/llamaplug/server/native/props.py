"""GET /props, GET /slots and POST /slots/{id_slot}?action=save|restore|erase: llama-server's server state endpoints.

Slot files live under --slot-save-path only: a filename is checked as llama-server checks
it (fs_validate_filename: no path separator, no "..", no control or reserved character),
so no request reaches a file outside that folder, nor through a link planted in it: a slot
file is opened without following a symbolic link (llama-server follows one) and must be a
plain file. Without --slot-save-path, save and restore are refused (llama-server: 501
"Start it with `--slot-save-path`"; here a 400, no bad request reads as a server fault).

A saved file is Llama.save_state's: the KV cache with every slot's tokens, tied to the
model (saved_state.py); restoring it restores every slot. llama-server saves one slot's
sequence; `n_saved` and `n_restored` here count the named slot's tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Body, Depends, Query, Request

from ...high import saved_state
from ...high.chat_template import ChatTemplate
from ..api_error import ModelNotLoadedError
from ..deps import client_gone, models, queried_model
from ..dialects import NATIVE
from ..errors import ERROR_RESPONSES, BadRequestError, NotSupportedError, ServerFaultError
from ..registry import ModelRegistry, Served
from .schemas import SlotFile

router = NATIVE.router()
log = logging.getLogger("llamaplug.server.slots")


@router.get("/props", responses=ERROR_RESPONSES)
async def props(request: Request, model: str | None = None) -> dict[str, Any]:
    """The model's properties; a sleeping model's (--sleep-idle) as it had them, without waking it (as
    llama-server: /props is one of the routes a sleeping server answers from what it kept). A loaded model's are
    read without a lease, so that /props never keeps it awake (nor its keep-alive running). Without `model`, a
    server of several models (llama-server's router mode) describes itself, as llama-server's router."""
    registry = models(request)
    if model is None and registry.router:
        return router_props(request.app.state, registry)
    asleep = registry.sleeping(model)
    kept = request.app.state.props_asleep.get(asleep) if asleep is not None else None
    if kept is not None:
        return {**kept, "is_sleeping": True}
    try:
        return props_of(request.app.state, registry.resolve(model))
    except ModelNotLoadedError:
        async with registry.lease(model, gone=client_gone(request)) as served:
            return props_of(request.app.state, served)


def router_props(state: Any, registry: ModelRegistry) -> dict[str, Any]:
    """llama-server's router's /props: its role, --models-max (0: no bound, as llama-server's 0), whether it
    loads a model a request asks for, and the same placeholders for one model's fields (model_alias "llama-server",
    model_path "none"; its web UI reads them)."""
    return {"role": "router", "max_instances": registry.max_loaded or 0, "models_autoload": registry.autoload,
            "model_alias": "llama-server", "model_path": "none",
            "default_generation_settings": {"params": None, "n_ctx": 0}, "ui_settings": {},
            "build_info": build_info(), "cors_proxy_enabled": bool(getattr(state, "ui_mcp_proxy", False))}


def props_of(state: Any, served: Served) -> dict[str, Any]:
    """/props of `served`, loaded (`state`: the app's)."""
    llama, model = served.llama, served.llama.model
    template = ChatTemplate.for_model(model, served.chat_template)
    defaults = llama.params
    return {
        "default_generation_settings": {"params": {"seed": defaults.seed, "n_predict": -1},
                                        "n_ctx": llama.engine.n_ctx_seq},
        "total_slots": llama.engine.n_slots, "model_alias": served.id, "model_path": str(defaults.model_path),
        "modalities": {"vision": llama.projector is not None, "audio": False, "video": False},
        "chat_template": template.source or "", "bos_token": template.bos_token, "eos_token": template.eos_token,
        "build_info": build_info(), "endpoint_slots": getattr(state, "endpoint_slots", True),
        "endpoint_props": False, "endpoint_metrics": getattr(state, "endpoint_metrics", True),
        "is_sleeping": False,
    }


@router.get("/slots", responses={**ERROR_RESPONSES, 501: ERROR_RESPONSES[400]})
async def slots(request: Request, served: Annotated[Served, Depends(queried_model)]) -> list[dict[str, Any]]:
    if not getattr(request.app.state, "endpoint_slots", True):
        raise NotSupportedError("This server does not support slots endpoint. Start it with `--slots`")
    engine = served.llama.engine
    # prompt_cache (ours): where the slot's last prompt found its cached tokens, and how many
    return [{"id": i, "n_ctx": engine.n_ctx_seq, "speculative": False, "is_processing": running,
             "prompt_cache": {"origin": origin, "n_cached": cached}}
            for i, (running, (origin, cached)) in enumerate(zip(engine.slots_running(), engine.slots_cache()))]


@router.post("/slots/{id_slot}", responses=ERROR_RESPONSES)
async def slot_action(request: Request, id_slot: int, action: Annotated[Literal["save", "restore", "erase"], Query()],
                      served: Annotated[Served, Depends(queried_model)],
                      body: Annotated[SlotFile | None, Body()] = None) -> dict[str, Any]:
    if not 0 <= id_slot < served.llama.engine.n_slots:
        raise BadRequestError("Invalid slot ID", param="id_slot")
    if action == "erase":
        return await asyncio.to_thread(_erase, served, id_slot)
    folder = request.app.state.slot_save_path
    if folder is None:
        raise BadRequestError("This server does not support slots action. Start it with `--slot-save-path`",
                              param="action")
    if body is None or body.filename is None:
        raise BadRequestError("filename: a JSON body {\"filename\": ...} is needed", param="filename")
    if not valid_filename(body.filename):
        raise BadRequestError("Invalid filename", param="filename")
    if action == "save":
        return await asyncio.to_thread(_save, served, id_slot, Path(folder), body.filename)
    return await asyncio.to_thread(_restore, served, id_slot, Path(folder), body.filename)


def valid_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename (no subfolders): a plain file name that cannot leave its folder."""
    if not name or len(name.encode("utf-8", "surrogatepass")) > 255:
        return False
    for c in name:
        code = ord(c)
        if (code <= 0x1F or code == 0x7F or 0x80 <= code <= 0x9F or code in (0xFF0E, 0x2215, 0x2216, 0xFFFD, 0xFEFF)
                or 0xD800 <= code <= 0xDFFF or c in ':*?"<>|/\\'):
            return False
    if name[0] == " " or name[-1] in " ." or ".." in name or name == ".":
        return False
    return True


def _save(served: Served, id_slot: int, folder: Path, name: str) -> dict[str, Any]:
    start = time.perf_counter()
    data = served.llama.save_state()
    assert isinstance(data, bytes)
    with _slot_file(folder, name, os.O_WRONLY | os.O_CREAT, "save") as fd:
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    slots, _ = saved_state.unpack(served.llama, data)
    return {"id_slot": id_slot, "filename": name, "n_saved": len(slots[id_slot]), "n_written": len(data),
            "timings": {"save_ms": (time.perf_counter() - start) * 1e3}}


def _restore(served: Served, id_slot: int, folder: Path, name: str) -> dict[str, Any]:
    start = time.perf_counter()
    with _slot_file(folder, name, os.O_RDONLY, "restore") as fd, os.fdopen(fd, "rb", closefd=False) as f:
        data = f.read()
    served.llama.load_state(data)
    slots, _ = saved_state.unpack(served.llama, data)
    return {"id_slot": id_slot, "filename": name, "n_restored": len(slots[id_slot]), "n_read": len(data),
            "timings": {"restore_ms": (time.perf_counter() - start) * 1e3}}


@contextlib.contextmanager
def _slot_file(folder: Path, name: str, flags: int, action: str) -> Iterator[int]:
    """The slot file `name` of `folder`, opened with `flags` as a plain file of that folder only: the name is
    looked up in the folder opened once (no path walked again), a symbolic link there is not followed
    (O_NOFOLLOW: a link planted in the folder would have the server write or read its target), and what is not
    a regular file with one link (a FIFO, a device, a hard link to a file elsewhere) is refused. The errors name
    the file as the request did, never the server's folder."""
    try:
        folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        log.error("--slot-save-path %s is not a folder this server can open", folder)
        raise ServerFaultError(f"Unable to {action} slot: the slot folder (--slot-save-path) cannot be opened",
                               param="filename") from None
    try:
        try:  # O_NONBLOCK: opening a FIFO does not wait for its other end
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666, dir_fd=folder_fd)
        except FileNotFoundError:
            raise BadRequestError(f"Unable to {action} slot: no such slot save file", param="filename") from None
        except OSError as exc:
            why = "it is a symbolic link, not followed" if exc.errno == errno.ELOOP else exc.strerror
            raise BadRequestError(f"Unable to {action} slot file {name!r}: {why}", param="filename") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
                raise BadRequestError(f"Unable to {action} slot file {name!r}: not a plain file of the slot folder "
                                      "(a hard link, a FIFO or a device)", param="filename")
            os.set_blocking(fd, True)
            yield fd
        finally:
            os.close(fd)
    finally:
        os.close(folder_fd)


def _erase(served: Served, id_slot: int) -> dict[str, Any]:
    with served.llama.engine.idle("erasing a slot") as slots:
        n = len(slots[id_slot])
        slots[id_slot].clear()  # the engine drops a slot's cells past what its list says it holds
    return {"id_slot": id_slot, "n_erased": n}


def build_info() -> str:
    """llama-server's build string, "b<build number>-<commit>": the native library's, whose build-info.cpp
    core/CMakeLists.txt writes with build number 0 (the pin is a source tree, not a git checkout with a count of
    commits; the pin's own llama-server built from it says "b0-unknown") and the pinned commit."""
    from ..._version import LLAMA_CPP_COMMIT

    return f"b0-{LLAMA_CPP_COMMIT}"
