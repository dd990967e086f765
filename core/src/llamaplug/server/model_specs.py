"""What `llamaplug serve` serves: ModelSpecs from repeated `-m` or from a `--models-dir` and its `models.toml`.

A models dir serves every `*.gguf` in it (projector files, named `mmproj*` or given as
some model's `mmproj`, excepted), each under its file name. An optional `models.toml`
there gives a model's own settings, in a table named by its file name:

    ["SmolLM2-135M-Instruct-Q8_0.gguf"]
    n_ctx = 2048              # the whole KV cache of this model (as -c)
    n_seq_max = 2             # its slots (as -np)
    aliases = ["small"]       # other names a request's `model` may give
    mmproj = "mmproj-x.gguf"  # a projector (relative to the dir)
    chat_template = "chatml"  # a Jinja template or a llama.cpp template name

An unknown key, a wrong type or a table naming no file is an error naming the file and key.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import InvalidModelError, InvalidParameterError, LlamaError, ModelNotFoundError
from ..params import LlamaParams

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (the server extra installs tomli there)
    import tomli as tomllib

log = logging.getLogger("llamaplug.server.models")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How to serve one model that the registry loads itself: its API id, its other names, its load parameters."""

    id: str
    params: LlamaParams
    aliases: tuple[str, ...] = ()
    pooling: str | None = None  # for /v1/embeddings (see Served.of)
    chat_template: str | None = None  # overrides the GGUF's own
    tags: tuple[str, ...] = ()  # llama-server's --tags: informational, shown in /v1/models
    named: bool = False  # the id came from -a: /v1/models lists it among the aliases too, as llama-server
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)  # SamplerParams fields: requests' defaults


CONFIG_NAME = "models.toml"

# key -> (the types it takes, what it is)
_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "n_ctx": ((int,), "an integer"),
    "n_seq_max": ((int,), "an integer"),
    "mmproj": ((str,), "a file name"),
    "chat_template": ((str,), "a string"),
    "aliases": ((list,), "a list of strings"),
    "pooling": ((str,), '"mean", "cls" or "last"'),
}


def spec_for_file(path: str | Path, base: dict[str, Any], alias: str | None = None, tags: str | None = None,
                  **own: Any) -> ModelSpec:
    """The spec of one GGUF (`-m`): `base` LlamaParams fields, `own` overriding them (mmproj, chat_template, ...).

    `alias` and `tags` are comma-separated, as llama-server's -a and --tags: its names kept sorted (a set there),
    the first being the model's id and every one of them listed as its aliases.
    """
    path = Path(path)
    names = split_names(alias)
    spec = _spec(path, names[0] if names else served_name(path.name), tuple(names[1:]), base, own,
                 where=f"-m {path}")
    return dataclasses.replace(spec, tags=tuple(split_names(tags)), named=bool(names))


def served_name(file_name: str) -> str:
    """The name a model file is served under: its file name without ".gguf", as llama-server's router names a
    --models-dir's files and as Ollama names models (a request may still say "NAME.gguf": the registry reads both)."""
    return file_name[:-5] if file_name.lower().endswith(".gguf") and len(file_name) > 5 else file_name


def split_names(given: str | None) -> list[str]:
    """A comma-separated list of names as llama-server reads -a and --tags: stripped, sorted, without repeats."""
    return sorted({n.strip() for n in (given or "").split(",") if n.strip()})


def specs_from_dir(folder: str | Path, base: dict[str, Any], warn: Callable[[str], None] | None = None
                   ) -> list[ModelSpec]:
    """The specs of every GGUF model in `folder`, with its models.toml's settings (see the module's doc).

    A `*.gguf` that is not a GGUF file (its header does not read: a download cut short, a file misnamed) is
    left out, all of them said in one warning (`warn`, default the log's): served, it would have failed every
    model list (/api/tags reads each file's header, ~0.15 s for a 49k-token vocabulary, read here once) and every
    request that got it as the default model.
    """
    from ..high.model_card import card  # (here: `serve -m` imports this module before its model's load starts)

    folder = Path(folder)
    if not folder.is_dir():
        raise InvalidParameterError(f"--models-dir {folder}: not a directory", field="models_dir")
    config = _read_config(folder / CONFIG_NAME)
    files = {p.name: p for p in sorted(folder.glob("*.gguf")) if p.is_file()}
    skipped = {}
    for name, path in list(files.items()):
        try:
            card(path)  # what /api/tags reads of each (kept: the list's first answer pays nothing more)
        except LlamaError as exc:
            skipped[name] = str(exc)
            del files[name]
    if skipped:
        (warn or log.warning)(f"--models-dir {folder}: skipped {len(skipped)} *.gguf that are not GGUF files: "
                              + "; ".join(f"{name} ({why})" for name, why in skipped.items()))
    projectors = {str(table.get("mmproj")) for table in config.values() if "mmproj" in table}
    for name in config:
        if name not in files and name not in skipped:  # (a skipped one's table goes with it)
            raise InvalidParameterError(f"{folder / CONFIG_NAME}: [{name!r}] names no .gguf file in {folder} "
                                        f"(there are {', '.join(sorted(files)) or 'none'})", field=name)
    specs = []
    for name, path in files.items():
        if name in projectors or name.startswith("mmproj"):
            continue
        own = dict(config.get(name, {}))
        aliases = tuple(own.pop("aliases", ()))
        if "mmproj" in own:
            own["mmproj"] = folder / own["mmproj"]
        specs.append(_spec(path, served_name(name), aliases, base, own, where=f"{folder / CONFIG_NAME} [{name!r}]"))
    if not specs:
        raise InvalidParameterError(f"--models-dir {folder}: no .gguf model in it", field="models_dir")
    return specs


def _spec(path: Path, ident: str, aliases: tuple[str, ...], base: dict[str, Any], own: dict[str, Any],
          where: str) -> ModelSpec:
    fields = dict(base)
    for key in ("n_ctx", "n_seq_max"):
        if own.get(key) is not None:
            fields[key] = own[key]
    if own.get("mmproj") is not None:
        fields["mmproj_path"] = own["mmproj"]
    try:
        params = LlamaParams(model_path=path, **fields)
        if not params.n_outputs_max:
            params = params.replace(n_outputs_max=reserved_outputs(params))
    except ValueError as exc:  # pydantic's: a value out of range
        raise InvalidParameterError(f"{where}: {exc}", field=ident) from None
    return ModelSpec(ident, params, aliases, own.get("pooling"), own.get("chat_template"))


def load_failure(exc: LlamaError, params: LlamaParams) -> str:
    """What a client is told of why a model given by `params` failed to load: `exc` without the server's paths
    (each file the params name is said by its name) and, for a file that is no GGUF model, without what the
    reader found in it (its first bytes): the server's log has the whole reason."""
    paths = [params.model_path, params.mmproj_path, params.draft_model_path, *(p for p, _ in params.lora)]
    if isinstance(exc, (InvalidModelError, ModelNotFoundError)):
        named = [Path(p).name for p in paths if p is not None and str(p) in str(exc)]
        which = named[0] if named else Path(params.model_path).name
        return f"its file {which} cannot be read as a GGUF model (the server's log says why)"
    text = str(exc)
    for path in sorted({str(p) for p in paths if p is not None}, key=len, reverse=True):
        text = text.replace(path, Path(path).name)
    return text


def reserved_outputs(params: LlamaParams) -> int:
    """Rows of logits a served model's batches need, as llama-server reserves them: one per slot and per token a
    drafter may guess (llama.cpp's default, n_batch rows, costs a compute buffer n_batch / n_seq_max times larger)."""
    drafted = params.drafted_max()
    return max(params.n_seq_max, min(params.n_batch, params.n_seq_max * (1 + drafted)))


def _read_config(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidParameterError(f"{path}: not valid TOML: {exc}", field=str(path)) from None
    for name, table in raw.items():
        if not isinstance(table, dict):
            raise InvalidParameterError(f"{path}: {name!r} must be a table ([\"{name}\"]) of a model's settings",
                                        field=name)
        for key, value in table.items():
            if key not in _KEYS:
                raise InvalidParameterError(f"{path}: [{name!r}] has an unknown key {key!r} (known: "
                                            f"{', '.join(_KEYS)})", field=key)
            types, what = _KEYS[key]
            bad = not isinstance(value, types) or isinstance(value, bool)
            if key == "aliases" and not bad:
                bad = not all(isinstance(a, str) and a for a in value)
            if key == "pooling" and not bad:
                bad = value not in ("mean", "cls", "last")
            if bad:
                raise InvalidParameterError(f"{path}: [{name!r}] {key} must be {what}, not {value!r}", field=key)
    return raw
