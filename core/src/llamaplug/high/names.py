"""One way from a model's name to its file, for every command (`run`, `chat`, `serve -m`, `show`, `rm`, `inspect`)
and `llamaplug list`.

A name is, tried in this order:
- a path to a GGUF file;
- a catalog model's name (`llamaplug info` lists them; catalog.py);
- `org/repo[:TAG]` (also `hf.co/org/repo[:TAG]`, as Ollama pulls from the Hub): a Hugging Face model, read from
  the Hub's cache without asking the network when it is there, else downloaded (when the caller allows it);
each with Ollama's `:latest` allowed at its end (it names the same thing). A bare word that is none of these is a
ModelNotFoundError pointing to `llamaplug list`; anything else is still taken as a path (the loader then says the file
is missing), so a name that is not found is said in one ModelNotFoundError.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ..errors import HubError, ModelNotFoundError

_HOSTS = ("https://huggingface.co/", "https://hf.co/", "huggingface.co/", "hf.co/")


def bare(name: str) -> str:
    """`name` without Ollama's default tag (":latest")."""
    return name.removesuffix(":latest")


def hub_ref(name: str) -> tuple[str, str | None] | None:
    """("org/repo", TAG or None) for a Hugging Face name ("org/repo[:TAG]", "hf.co/org/repo[:TAG]"), else None."""
    from .hub import parse_ref

    text = bare(name)
    for host in _HOSTS:
        text = text.removeprefix(host)
    return parse_ref(text)


def is_catalog_name(name: str) -> bool:
    """Whether `name` is a catalog model's name (installed or not)."""
    return _catalog(name) is not None


def _catalog(name: str) -> str | None:
    from ..catalog import entries

    wanted = bare(name)
    return next((e.name for e in entries() if e.name == wanted), None)


def cached(repo: str, tag: str | None) -> Path | None:
    """The file `org/repo[:TAG]` names in the Hub's cache (its main revision first, then any snapshot), or None.
    Asks nothing of the network."""
    from ..errors import InvalidParameterError
    from . import hub

    files = hub.cached_files(repo)
    if files is not None:
        try:
            first = hub.pick(files, repo, tag=tag)[0]
        except (ModelNotFoundError, InvalidParameterError):
            pass
        else:
            snapshot = hub.cached_snapshot(repo)
            if snapshot is not None and (snapshot / first).is_file():
                return snapshot / first
    found = [m for m in hub.cached_models() if m.repo_id == repo]
    if not found:
        return None
    try:
        first = hub.pick([m.file for m in found], repo, tag=tag)[0]
    except (ModelNotFoundError, InvalidParameterError):
        return None
    return next(m.path for m in found if m.file == first)


def resolve(name: str, *, download: bool = True) -> str | Path:
    """The file `name` names (see the module's doc). `download`: fetch a Hub model that is not cached (run, serve);
    without it a Hub name that is not cached is a ModelNotFoundError saying to pull it (show, rm).

    A name that is none of these comes back as it was given: a path, which the loader says is missing."""
    if Path(name).exists():
        return name
    if bare(name) != name and Path(bare(name)).exists():
        return bare(name)
    entry = _catalog(name)
    if entry is not None:
        from ..catalog import default_model

        return default_model(entry)
    ref = hub_ref(name)
    if ref is None and "/" not in name and os.sep not in name and not name.lower().endswith(".gguf"):
        # a bare word ("llama3") reads as a model's name, not a path: say where the names are
        raise ModelNotFoundError(f"{name}: no such model (not a file, not a catalog model): `llamaplug list` shows "
                                 "the models it takes by name; `llamaplug pull org/repo[:TAG]` adds one from the Hub")
    if ref is None or name.lower().endswith(".gguf"):
        return name
    repo, tag = ref
    try:
        found = cached(repo, tag)
    except HubError:  # no huggingface_hub: said by the download below, or here
        if not download:
            raise
        found = None
    if found is not None:
        return found
    if not download:
        raise ModelNotFoundError(f"{name}: not a file, not a catalog model, and {repo}"
                                 f"{':' + tag if tag else ''} is not in the Hub cache: `llamaplug pull {name}` "
                                 "first")
    from .hub import download as fetch

    return fetch(repo, tag=tag)


@dataclasses.dataclass(frozen=True)
class Runnable:
    """One model the CLI can run by `name`."""

    name: str
    path: Path
    size: int  # bytes, every part
    modified: float
    source: str  # "catalog" or "hub"


def runnable() -> list[Runnable]:
    """Every model the CLI can run by name: the installed catalog models, then the Hub cache's GGUF models."""
    from ..catalog import entries

    out = []
    for entry in entries():
        try:
            path = entry.locate()
        except Exception:  # noqa: BLE001 - a plugin's locate() failing leaves that model out, not the list
            path = None
        if path is not None and path.is_file():
            stat = path.stat()
            out.append(Runnable(entry.name, path, stat.st_size, stat.st_mtime, "catalog"))
    try:
        from . import hub

        models = hub.cached_models()
    except HubError:  # no huggingface_hub: nothing can be in its cache
        models = []
    out += [Runnable(m.name, m.path, m.size, m.modified, "hub") for m in models]
    return out
