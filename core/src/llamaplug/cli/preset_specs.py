"""`llamaplug serve --models-preset FILE`: each preset of llama-server's INI file (server/presets.py reads it) as a
model the registry serves, with llama-server's meanings.

A key is a llama-server flag without its dashes (any spelling: `c`, `ctx-size`), its LLAMA_ARG_* name, or one of
the preset-only keys; its value means what the flag means on `serve`'s command line (the serve parser reads it,
so a flag serve refuses is refused here too, named with its file and line). Per model: the model (`model`/`m`,
`hf-repo`/`hf`; none: the command line model of the preset's id, or the section's name as `org/repo[:TAG]` from
the Hugging Face cache), `alias`, `tags`, -c, -np, -ngl, -t, -b, -ub, -s, -fa, --cache-ram, -kvu, --mmproj,
--pooling, the chat template, the drafting flags (`spec-draft-hf` / `hfd`: the draft model from the Hub cache)
and the request defaults (--temp, ...). A flag that is the whole server's on serve (--metrics, --keep-alive, ...)
is an error saying so. As llama-server's router: the keys the router sets itself (host, port, api-key, ssl-*,
models-*) are dropped; the command line wins over a preset, a preset over `[*]`; `load-on-startup` loads the
model at the start (at most --models-max of them), `dedup-cache-models` hides the command line's model of the same
Hugging Face file (`hf-repo`, `spec-draft-hf`) from GET /models. `stop-timeout` is checked and has nothing to do
here: a model is unloaded in this process, there is no child server to kill.

A Hub model must be in the Hugging Face cache (`llamaplug pull` first): llama-server downloads one at its first
load, serve resolves a preset when it reads the file (at the start, and at each GET /models?reload=1).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import LlamaError
from ..serve_flags import LLAMA_ARG_ENV, LLAMA_SERVER_FLAGS
from ..server.model_specs import ModelSpec, spec_for_file, split_names
from ..server.presets import FALSE, TRUE, Option, PresetError, PresetModels, Section, is_truthy, read_ini
from .options import REQUEST_DEFAULTS, chat_settings, model_fields, request_defaults

log = logging.getLogger("llamaplug.server.presets")

# The pin's preset-only keys (common_params_add_preset_options), by their key and their variable's name.
PRESET_ONLY = {"load-on-startup": "load-on-startup", "__PRESET_LOAD_ON_STARTUP": "load-on-startup",
               "stop-timeout": "stop-timeout", "__PRESET_STOP_TIMEOUT": "stop-timeout",
               "dedup-cache-models": "dedup-cache-models", "__PRESET_DEDUP_CACHE_MODELS": "dedup-cache-models"}
# What llama-server's router sets itself (unset_reserved_args, and the host and port it gives each child).
RESERVED = {"--ssl-key-file", "--ssl-cert-file", "--api-key", "--api-key-file", "--models-dir", "--models-max",
            "--models-preset", "--models-autoload", "--no-models-autoload", "--host", "--port"}
MODEL_FLAGS = {"-m", "--model", "-hf", "-hfr", "--hf-repo"}
DRAFT_HUB_FLAGS = {"--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"}
# serve's flags a preset gives its own model (their dests; options.model_fields reads them)
FIELDS = {"ctx_size", "parallel", "n_gpu_layers", "threads", "n_batch", "n_ubatch", "seed", "flash_attn", "cache_ram",
          "kv_unified"}
DRAFT = {"draft_model", "spec_type", "spec", "draft_max", "draft_min", "draft_p_min", "ngram_size", "ngram_mod_n_match",
         "ngram_mod_n_min", "ngram_mod_n_max", "draft_synth_rates", "draft_synth_len"}
OWN = {"alias", "tags", "mmproj", "pooling", "chat_template", "chat_template_file"}
SAMPLING = {f"default_{field}" for _, field, _ in REQUEST_DEFAULTS}


class _Refusal(Exception):
    """The serve parser's error for one preset option (raised instead of its exit)."""


def loader(path: str, args: argparse.Namespace, base: dict[str, Any], given: list[ModelSpec]
           ) -> Callable[[], PresetModels]:
    """What reads `path` into PresetModels, at the start and at each reload: `args` the command line's (it wins over
    a preset), `base` the LlamaParams fields it gives every model, `given` its own models."""
    return functools.partial(read_presets, Path(path), args, base, tuple(given))


def read_presets(path: Path, args: argparse.Namespace, base: dict[str, Any], given: tuple[ModelSpec, ...]
                 ) -> PresetModels:
    glob, sections = read_ini(path)
    serve = _Raising(args.serve_parser)
    specs, startup, dedup = [], [], set()
    by_id = {spec.id: spec for spec in given}
    for section in sections.values():
        options = _options(path, serve, glob, section)
        spec, hub_files = _spec(path, serve, section, options, args, base, by_id)
        specs.append(spec)
        only = {name: (option, value) for name, (option, value) in options.items() if name in PRESET_ONLY.values()}
        if "load-on-startup" in only and is_truthy(only["load-on-startup"][1]):
            startup.append(spec.id)
        if "stop-timeout" in only:
            option, value = only["stop-timeout"]
            try:
                int(value)
            except ValueError:
                raise PresetError(f"{section.where(path, option)}: stop-timeout must be a number of seconds, not "
                                  f"{value!r}", field=option.key) from None
        if "dedup-cache-models" in only and is_truthy(only["dedup-cache-models"][1]):
            dedup |= hub_files
    ids = {spec.id for spec in specs}
    hidden = frozenset(g.id for g in given if g.id not in ids and str(g.params.model_path) in dedup)
    if len(startup) > (args.max_loaded or len(startup)):
        raise PresetError(f"{path}: {len(startup)} presets have load-on-startup, more than --models-max "
                          f"{args.max_loaded}", field="load-on-startup")
    return PresetModels(tuple(specs), hidden, tuple(startup))


class _Raising:
    """`serve`'s parser (the one the command line was read with: args.serve_parser) whose errors raise _Refusal
    while a preset is read, instead of printing its usage and exiting."""

    def __init__(self, serve: argparse.ArgumentParser):
        self.parser = serve
        self._option_string_actions = serve._option_string_actions  # noqa: SLF001
        self._actions = serve._actions  # noqa: SLF001

    def parse_args(self, words: list[str]) -> argparse.Namespace:
        def error(message: str) -> None:
            raise _Refusal(message)

        self.parser.error = error  # type: ignore[method-assign]
        try:
            return self.parser.parse_args(words)
        finally:
            del self.parser.error


def _flag(key: str) -> str | None:
    """The llama-server spelling a preset's key names (a flag without its dashes, or its variable), else None."""
    for spelling in (f"-{key}", f"--{key}"):
        if spelling in LLAMA_SERVER_FLAGS:
            return spelling
    return LLAMA_ARG_ENV.get(key)


def _options(path: Path, serve: _Raising, glob: Section | None, section: Section
             ) -> dict[str, tuple[Option, str]]:
    """The section's options over `[*]`'s, each by what it sets (a serve dest, or a preset-only key): (its line,
    its llama-server spelling's value)."""
    out: dict[str, tuple[Option, str]] = {}
    for owner in ([glob] if glob is not None else []) + [section]:
        for option in owner.options.values():
            if option.key in PRESET_ONLY:
                out[PRESET_ONLY[option.key]] = (option, option.value)
                continue
            flag = _flag(option.key)
            if flag is None:
                raise PresetError(f"{owner.where(path, option)}: option {option.key!r} not recognized (a key is a "
                                  "llama-server flag without its dashes, its LLAMA_ARG_* name, or load-on-startup, "
                                  "stop-timeout, dedup-cache-models)", field=option.key)
            if flag in RESERVED:
                log.warning("%s: %s is the router's own setting: dropped (as llama-server)", owner.where(path, option),
                            option.key)
                continue
            action = serve._option_string_actions.get(flag)  # noqa: SLF001
            dest = "model" if flag in MODEL_FLAGS else "draft_hub" if flag in DRAFT_HUB_FLAGS else (
                action.dest if action is not None else flag)
            out[dest] = (dataclasses.replace(option, key=flag), option.value)
    return out


def _argv(serve: _Raising, flag: str, value: str) -> list[str]:
    """The command line words that set `flag` to `value` as a preset does (a switch: on, off, or its --no- form)."""
    action = serve._option_string_actions.get(flag)  # noqa: SLF001
    if action is None or action.nargs != 0:
        longs = [s for s in (action.option_strings if action is not None else [flag]) if s.startswith("--")]
        return [f"{(longs or [flag])[0]}={value}"] if longs else [flag, value]
    lowered = value.strip().lower()
    if lowered not in TRUE + FALSE:
        raise _Refusal(f"{flag} is a switch: its value is one of {', '.join(TRUE + FALSE)}, not {value!r}")
    on = lowered in TRUE
    if flag.startswith("--no-"):  # the pin reads `no-x = 1` as x off
        on, flag = not on, "--" + flag[5:]
    if on:
        return [flag]
    negative = "--no-" + flag.lstrip("-")
    return [negative] if negative in action.option_strings else []


def _spec(path: Path, serve: _Raising, section: Section, options: dict[str, tuple[Option, str]],
          args: argparse.Namespace, base: dict[str, Any], given: dict[str, ModelSpec]) -> tuple[ModelSpec, set[str]]:
    """The section's model, and the Hub files it names (hf-repo, spec-draft-hf) for dedup-cache-models."""
    from ..high import names

    def resolved(option: Option, value: str) -> str:
        try:
            return str(names.resolve(value, download=False))
        except LlamaError as exc:
            raise PresetError(f"{section.where(path, option)}: {option.key.lstrip('-')} = {value}: {exc}",
                              field=option.key) from None

    merged = copy.copy(args)
    defaults = {action.dest: action.default for action in serve._actions}  # noqa: SLF001
    given_dests: set[str] = set()
    for dest, (option, value) in options.items():
        if dest in PRESET_ONLY.values() or dest in ("model", "draft_hub"):
            continue
        try:
            words = _argv(serve, option.key, value)
            own = serve.parse_args(words) if words else None
        except _Refusal as exc:
            raise PresetError(f"{section.where(path, option)}: {option.key.lstrip('-')} = {value}: {exc}",
                              field=option.key) from None
        if own is None:
            continue
        if dest not in FIELDS and dest not in DRAFT and dest not in OWN and dest not in SAMPLING:
            raise PresetError(f"{section.where(path, option)}: {option.key} is the whole server's on `llamaplug "
                              "serve`, not one model's: give it on the command line", field=option.key)
        given_dests.add(dest)
        if dest in OWN or getattr(args, dest, None) == defaults.get(dest):  # the command line wins
            setattr(merged, dest, getattr(own, dest))
    hub_files: set[str] = set()
    if "model" in options:
        option, value = options["model"]
        model = resolved(option, value)
        if option.key in ("-hf", "-hfr", "--hf-repo"):
            hub_files.add(model)
    elif section.name in given:
        model = str(given[section.name].params.model_path)
    elif names.hub_ref(section.name) is not None:
        model = resolved(Option(section.name, section.name, section.line), section.name)
    else:
        raise PresetError(f"{section.where(path)}: no model: give `model = FILE` or `hf-repo = ORG/REPO[:TAG]` "
                          "(or name the section as a model the server serves)", field="model")
    if "draft_hub" in options:
        option, value = options["draft_hub"]
        draft = resolved(option, value)
        hub_files.add(draft)
        if getattr(args, "draft_model", None) is None:
            merged.draft_model = draft
            given_dests.add("draft_model")
    try:
        fields = {**base, **model_fields(merged)}  # (merged is the command line but where the preset gave its own)
        template = chat_settings(merged)[0]
        sampling = request_defaults(merged)
        spec = spec_for_file(model, fields, None, mmproj=getattr(merged, "mmproj", None) if "mmproj" in given_dests
                             else None, pooling=merged.pooling, chat_template=template)
    except (LlamaError, ValueError) as exc:
        raise PresetError(f"{section.where(path)}: {exc}", field=section.name) from None
    alias = ",".join(merged.alias) if "alias" in given_dests else None
    tags = merged.tags if "tags" in given_dests else None
    return dataclasses.replace(spec, id=section.name, aliases=tuple(a for a in split_names(alias) if a != section.name),
                               tags=tuple(split_names(tags)), sampling=sampling), hub_files
