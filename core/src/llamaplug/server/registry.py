"""The models a server serves, by the name a request gives in its `model` field.

One today (create_app's Llama); a server of several adds them here, and every route
finds its model through `ModelRegistry.resolve` (deps.py), so no route changes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

from ..high.async_llama import AsyncLlama
from ..high.llama import Llama
from .errors import ApiError


@dataclasses.dataclass(eq=False)
class Served:
    """A served model: its API name, the Llama, and its serving settings."""

    id: str
    llama: Llama
    pooling: str | None = None  # for /v1/embeddings (see create_app)
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    allama: AsyncLlama = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.allama = AsyncLlama(self.llama)

    @classmethod
    def of(cls, llama: Llama, name: str | None = None, pooling: str | None = None) -> Served:
        """`llama` under `name` (default: its file's name), pooling by default its own, mean for a model without."""
        return cls(name or llama.params.model_path.name, llama, pooling or _own_pooling(llama))


class ModelRegistry:
    """The served models, the first being the one a request without `model` gets."""

    def __init__(self, models: list[Served]):
        self._models = {m.id: m for m in models}

    def __iter__(self) -> Iterator[Served]:
        return iter(self._models.values())

    def resolve(self, name: str | None) -> Served:
        """The model named `name` (None: the default one); an unknown name is a 404 naming what is served.

        Single-model leniency (llama-server's): with one model served, any name gets it, so clients
        that must send some `model` ("gpt-4o-mini") work unchanged. With several, an unknown name is a 404.
        """
        if name is None or len(self._models) == 1:  # single-model leniency, see above
            return next(iter(self._models.values()))
        try:
            return self._models[name]
        except KeyError:
            have = ", ".join(repr(n) for n in self._models)
            raise ApiError(404, f"model {name!r} is not served here (this server has {have})",
                           param="model", code="model_not_found") from None

    def close(self) -> None:
        for served in self:
            served.llama.close()


def _own_pooling(llama: Llama) -> str | None:
    meta = llama.model.metadata
    own = meta.get(f"{meta.get('general.architecture', '')}.pooling_type", "0")
    return None if own not in ("0", "-1") else "mean"  # 0 none, -1 unspecified
