"""What a server serves: a model under its API name with its serving settings (`Served`), and the registry's
record of each model's lifecycle (`ModelEntry`, `ModelState`; registry.py moves them)."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from typing import Any

from ..high.async_llama import AsyncLlama
from ..high.embeddings import default_pooling
from ..high.llama import Llama
from .chat_settings import ChatSettings
from .model_specs import ModelSpec


class ModelState(str, enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    SLEEPING = "sleeping"  # unloaded by --sleep-idle; loads again on the next request


@dataclasses.dataclass(eq=False)
class Served:
    """A served model: its API name, the Llama, and its serving settings."""

    id: str
    llama: Llama
    pooling: str | None = None  # for /v1/embeddings (see create_app)
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    chat_template: str | None = None
    chat: ChatSettings = dataclasses.field(default_factory=ChatSettings)
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)  # what a request's own fields override
    allama: AsyncLlama = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.allama = AsyncLlama(self.llama)

    def chat_options(self, **given: Any) -> dict[str, Any]:
        """ChatSpec's keyword arguments for a chat request (reasoning options, template): the request's fields
        (None: not given), then this model's template and the server's chat defaults, filled in once here."""
        return self.chat.options(self.chat_template, **given)

    @classmethod
    def of(cls, llama: Llama, name: str | None = None, pooling: str | None = None,
           chat_template: str | None = None) -> Served:
        """`llama` under `name` (default: its file's name), pooling by default its own, mean for a model without."""
        return cls(name or llama.params.model_path.name, llama, pooling or own_pooling(llama),
                   chat_template=chat_template)


class ModelEntry:
    """One served model's lifecycle state in a registry (event-loop thread only)."""

    def __init__(self, spec: ModelSpec | None, served: Served | None):
        self.spec = spec  # None: given loaded (create_app's Llama), never unloaded
        self.served = served
        self.id = spec.id if spec is not None else served.id  # type: ignore[union-attr]
        self.aliases = spec.aliases if spec is not None else ()
        self.created = served.created if served is not None else int(time.time())
        self.state = ModelState.LOADED if served is not None else ModelState.UNLOADED
        self.users = 0  # leases held
        self.wanted = 0  # requests waiting for this entry's running load (each gets a lease when it ends)
        self.last_used = time.monotonic()
        self.keep_alive: float | None = None  # the last request's `keep_alive` (None: the server's)
        self.loading: asyncio.Task[None] | None = None
        self.unloading: asyncio.Task[None] | None = None
        self.down = False  # its engine stopped: down until a load succeeds
        self.spared = False  # the unload under way, for another model's load, is called off (registry._evict)
        self.timer: asyncio.TimerHandle | None = None
        self.drained = asyncio.Event()
        self.drained.set()

    def changed(self) -> None:
        if self.users == 0 and self.wanted == 0:
            self.drained.set()
        else:
            self.drained.clear()

    def spare(self) -> None:
        """Call off the unload under way, which waits for this model's requests to end."""
        self.spared = True
        self.drained.set()  # wakes that wait, which sees `spared`; and at once not drained again:
        self.changed()

    def waiting(self) -> int:
        """Its leases beyond its slots: requests queued in its engine."""
        if self.served is None:
            return 0
        return max(0, self.users - self.served.llama.engine.n_slots)


def own_pooling(llama: Llama) -> str | None:
    return default_pooling(llama)  # Llama.embed's default too: the two agree
