"""The hooks a llamaplug plugin may implement.

A plugin is a module registered under the ``llamaplug`` entry-point group; it
implements any of these with ``@llamaplug.hookimpl``. Registration hooks get a
``register`` callback and call it once per thing they provide; ``firstresult``
hooks are asked in turn until one answers (not None). What else a plugin may use
of the core is in ``llamaplug.plugin_api``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from pathlib import Path

    from .blocks.context import LlamaContext
    from .blocks.model import LlamaModel
    from .catalog import CatalogEntry
    from .params import LlamaParams
    from .plugin_api import Command, Projector
    from .probes import BackendSpec

hookspec = pluggy.HookspecMarker("llamaplug")
hookimpl = pluggy.HookimplMarker("llamaplug")


@hookspec
def llamaplug_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register compute backends: call ``register(BackendSpec(...))`` for each one this plugin ships."""


@hookspec
def llamaplug_register_models(register: Callable[[CatalogEntry], None]) -> None:
    """Register default-model catalog entries (models that a package on the registry ships)."""


@hookspec
def llamaplug_model_loaded(model: LlamaModel) -> None:
    """Called after a model is loaded, before any context is created on it."""


@hookspec
def llamaplug_context_created(context: LlamaContext) -> None:
    """Called after a context is created."""


@hookspec
def llamaplug_register_samplers(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register sampler factories: ``register(name, factory)``.

    ``SamplerChain().add(name, *args, **kwargs)`` calls ``factory(*args, **kwargs)``,
    which returns a ``LlamaSampler`` that the chain then owns.
    """


@hookspec
def llamaplug_register_tokenizers(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register external tokenizers: ``register(name, load)``.

    ``ModelParams(tokenizer="name:source")`` calls ``load("source", model)`` when the model is
    loaded; a tokenizer given as an object calls each ``load(obj, model)`` until one does not
    return None. ``load`` checks the tokenizer against ``model``'s vocabulary (raising a
    ``TokenizerError``) and returns an object with ``tokenize(text, add_bos, special) -> list[int]``
    and ``detokenize_bytes(tokens, special) -> bytes``, which the model then uses for its text.
    """


@hookspec(firstresult=True)
def llamaplug_open_projector(path: Path, model: LlamaModel, params: LlamaParams) -> Projector | None:
    """Open the multimodal projector ``LlamaParams.mmproj_path`` for ``model`` (at `Llama.load`).

    Return a `plugin_api.Projector` (closed with the model), or None when this plugin does not take
    the file; a file it takes but cannot open is a LlamaError naming it. The first answer wins.
    """


@hookspec(firstresult=True)
def llamaplug_describe_projector(path: Path) -> str | None:
    """One line on what the projector file ``path`` takes, for ``llamaplug info --mmproj FILE``.

    None when this plugin does not read such files; a LlamaError naming the file when it cannot.
    """


@hookspec
def llamaplug_register_commands(register: Callable[[Command], None]) -> None:
    """Add ``llamaplug`` subcommands: ``register(plugin_api.Command(...))`` for each one.

    The core's own commands, and the first plugin to register a name, win over a later one.
    """
