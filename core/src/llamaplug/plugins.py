"""The plugin manager: finds plugins through entry points, once per process.

LLAMAPLUG_PLUGINS limits which entry points load: a comma-separated list of
entry-point names (``backend_cpu,mtmd``); empty means none; unset means all.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

from . import hookspecs

if TYPE_CHECKING:
    from pathlib import Path

    from .blocks.model import LlamaModel
    from .params import LlamaParams
    from .plugin_api import Projector
    from .probes import BackendSpec

log = logging.getLogger("llamaplug.plugins")

ENTRY_POINT_GROUP = "llamaplug"

pm = pluggy.PluginManager("llamaplug")
pm.add_hookspecs(hookspecs)

_loaded = False
_lock = threading.Lock()
_broken: dict[str, str] = {}
_distributions: dict[str, str | None] = {}


def load_plugins() -> None:
    """Load every plugin allowed by LLAMAPLUG_PLUGINS; only the first call does anything."""
    global _loaded
    with _lock:
        if _loaded:
            return
        _loaded = True
        allowed = os.environ.get("LLAMAPLUG_PLUGINS")
        names = None if allowed is None else {n.strip() for n in allowed.split(",") if n.strip()}
        from importlib.metadata import entry_points  # here: importing it costs 60 ms at `import llamaplug`

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            # The core's own catalog always loads; the variable limits third-party plugins.
            if names is not None and ep.name != "catalog" and ep.name not in names:
                continue
            if pm.has_plugin(ep.name):
                continue
            dist = getattr(ep, "dist", None)
            _distributions[ep.name] = dist.name if dist is not None else None
            try:
                pm.register(ep.load(), name=ep.name)
            except Exception as exc:  # a broken plugin must not take the core down
                log.warning("plugin %s (%s) failed to load: %s", ep.name, ep.value, exc)
                _broken[ep.name] = f"{type(exc).__name__}: {exc}"


def broken_plugins() -> dict[str, str]:
    """Plugins whose import or registration hook failed, with the error."""
    load_plugins()
    return dict(_broken)


@dataclasses.dataclass(frozen=True)
class SamplerFactory:
    """A sampler a plugin registered: `factory(**options)` makes it."""

    name: str
    factory: Callable[..., Any]
    plugin: str
    distribution: str | None


def distribution_of(plugin: str) -> str | None:
    """The installed distribution that declared entry point `plugin` (None for one registered in code)."""
    load_plugins()
    return _distributions.get(plugin)


def sampler_factories() -> dict[str, SamplerFactory]:
    """Every sampler registered through llamaplug_register_samplers, by name (the first registration wins)."""
    return _factories("llamaplug_register_samplers")


TokenizerFactory = SamplerFactory  # the same record: a name, its `load` function and who registered it


def tokenizer_factories() -> dict[str, TokenizerFactory]:
    """Every tokenizer registered through llamaplug_register_tokenizers, by name (the first registration wins)."""
    return _factories("llamaplug_register_tokenizers")


def _factories(hook_name: str) -> dict[str, SamplerFactory]:
    found: dict[str, SamplerFactory] = {}
    for plugin, item in collect_from(hook_name):
        name, factory = item
        found.setdefault(name, SamplerFactory(name, factory, plugin, distribution_of(plugin)))
    return found


def collect(hook_name: str) -> list[Any]:
    """Call a ``register``-style hook and return what all plugins registered.

    Each plugin's hook runs on its own: one that raises registers nothing and is
    reported by `broken_plugins`, while the others still count.
    """
    return [item for _, item in collect_from(hook_name)]


def collect_from(hook_name: str) -> list[tuple[str, Any]]:
    """`collect`, with the name of the plugin that registered each item."""
    load_plugins()
    found: list[tuple[str, Any]] = []
    # pluggy calls the newest registration first; keep that order.
    for impl in reversed(getattr(pm.hook, hook_name).get_hookimpls()):
        mine: list[Any] = []

        def register(*item: Any, _into: list[Any] = mine) -> None:
            _into.append(item[0] if len(item) == 1 else item)

        try:
            impl.function(register=register)
        except Exception as exc:  # as at import: a broken plugin must not take the core down
            log.warning("plugin %s: %s failed: %s", impl.plugin_name, hook_name, exc)
            _broken[impl.plugin_name] = f"{hook_name}: {type(exc).__name__}: {exc}"
            continue
        found.extend((impl.plugin_name, item) for item in mine)
    return found


def backend_specs() -> Sequence[BackendSpec]:
    return sorted(collect("llamaplug_register_backends"), key=lambda s: -s.priority)


def first_answer(hook_name: str, **kwargs: Any) -> tuple[str, Any] | None:
    """Ask a ``firstresult`` hook as pluggy does, and say who answered: (plugin, answer), or None if none did.

    What a plugin raises propagates, as from the hook call.
    """
    load_plugins()
    for impl in reversed(getattr(pm.hook, hook_name).get_hookimpls()):
        if impl.hookwrapper or impl.wrapper:
            continue
        answer = impl.function(*(kwargs[name] for name in impl.argnames))
        if answer is not None:
            return impl.plugin_name, answer
    return None


def providers(hook_name: str) -> list[str]:
    """Who implements `hook_name`, in the order pluggy asks them: each one's distribution, or its plugin name."""
    load_plugins()
    return [distribution_of(impl.plugin_name) or impl.plugin_name
            for impl in reversed(getattr(pm.hook, hook_name).get_hookimpls())]


def open_projector(path: Path, model: LlamaModel, params: LlamaParams) -> Projector | None:
    """The projector the first plugin that takes `path` opens for `model` (None: no plugin takes it)."""
    load_plugins()
    return pm.hook.llamaplug_open_projector(path=path, model=model, params=params)
