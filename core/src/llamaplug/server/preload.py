"""A model loaded and warmed up before it serves, started before the server's own imports.

`llamaplug serve -m FILE` calls `start` as soon as it knows the model's parameters: the load is native code
(the GIL released), so it runs while the registry, the routes and the web stack import (most of a small
model's start); the registry then takes the loaded model (`ModelRegistry.preload(name, llama)`).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..high.llama import Llama
    from ..params import LlamaParams


def load_warmed(params: LlamaParams) -> Llama:
    """Llama.load, then its warm-up decode (llama-server's, before it says ready); closed again if that fails."""
    from ..high.llama import Llama  # here: importing it is part of what runs beside the web stack's imports

    llama = Llama.load(params)
    try:
        llama.warm_up()
    except BaseException:
        llama.close()
        raise
    return llama


def start(params: LlamaParams) -> Future[Llama]:
    """`load_warmed(params)` in a thread of its own; its errors come out of the future's result()."""
    loader = ThreadPoolExecutor(1, thread_name_prefix="llamaplug-preload")
    try:
        return loader.submit(load_warmed, params)
    finally:
        loader.shutdown(wait=False)
