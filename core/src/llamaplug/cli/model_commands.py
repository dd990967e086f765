"""`llamaplug pull`, `list`, `show`, `rm`, `ps`, `stop`: the Hugging Face cache's models, as Ollama's manage its own.

pull, list, show and rm work on the Hub's cache that the hub loader (high/hub.py) downloads into
(HF_HUB_CACHE; `llamaplug run org/repo:TAG` and `serve -m org/repo:TAG` read the same files);
a model is named "org/repo:TAG" (TAG: a quantization, as llama.cpp's -hf). list shows the installed
catalog models too, and show and rm take every name `run` and `inspect` take (high/names.py). ps asks
a running `llamaplug serve` what it has loaded (its Ollama API, /api/ps); stop unloads a model there as
`ollama stop` does (/api/generate with keep_alive 0: it stays served, loaded again by its next request).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import InvalidParameterError, LlamaError


def _ref(model: str) -> tuple[str, str | None]:
    from ..high import names

    ref = names.hub_ref(model)
    if ref is None:
        raise InvalidParameterError(f"{model!r} is not a Hugging Face model: give org/repo[:TAG]", field="model")
    return ref


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _ago(when: float) -> str:
    seconds = max(0.0, time.time() - when)
    for unit, length in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= length:
            n = int(seconds // length)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"


def cmd_pull(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..high import hub

    repo, tag = _ref(args.model)
    bars: dict[str, Any] = {}

    def progress(p: hub.Progress) -> None:
        bar = bars.get(p.file)
        if bar is None:
            bar = bars[p.file] = tqdm(total=p.total or None, unit="B", unit_scale=True, unit_divisor=1024,
                                      desc=f"pulling {p.file}", disable=args.quiet, file=sys.stderr)
        if p.total and bar.total != p.total:
            bar.total = p.total
        bar.update(p.completed - bar.n)

    try:
        path = hub.download(repo, tag=tag, progress=progress)
    finally:
        for bar in bars.values():
            bar.close()
    print(path)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from ..high import names
    from ..high.model_card import card

    rows = [("NAME", "SIZE", "QUANTIZATION", "MODIFIED")]
    for m in names.runnable():
        try:
            quant = card(m.path).quantization
        except LlamaError as exc:  # a broken file is listed as such, not the end of the list
            quant = f"unreadable ({type(exc).__name__})"
        rows.append((m.name, _size(m.size), quant, _ago(m.modified)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    return 0


def _find(model: str) -> Path:
    """The file `model` names, as `inspect` and `run` read names (high/names.py), never downloaded."""
    from ..high import names

    return Path(names.resolve(model, download=False))


def cmd_show(args: argparse.Namespace) -> int:
    from ..high.model_card import card

    c = card(_find(args.model))
    if args.template:
        print(c.chat_template or "")
        return 0
    meta = c.metadata()
    rows = [("architecture", c.family), ("parameters", c.parameter_size),
            ("context length", str(c.context_length or "")), ("embedding length", str(c.embedding_length or "")),
            ("quantization", c.quantization), ("size", _size(c.size)), ("file", str(c.path))]
    print("  Model")
    for key, value in rows:
        print(f"    {key:<20}{value}")
    print("\n  Capabilities")
    for cap in c.capabilities():
        print(f"    {cap}")
    if isinstance(meta.get("general.license"), str):
        print(f"\n  License\n    {meta['general.license']}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from ..high import hub, names

    for model in args.model:
        ref = names.hub_ref(model)
        if ref is not None and not Path(model).exists() and not model.lower().endswith(".gguf"):
            hub.remove_cached(*ref)
        elif names.is_catalog_name(model) and not Path(model).exists():
            from ..catalog import entries

            entry = next(e for e in entries() if e.name == names.bare(model))
            raise InvalidParameterError(f"{model!r} is a catalog model, installed by a Python package ({entry.install}"
                                        "): remove that package to remove it", field="model")
        else:
            _remove_file(Path(names.resolve(model, download=False)))
        print(f"deleted '{model}'")
    return 0


def _remove_file(path: Path) -> None:
    """Delete a GGUF model file (every part of a split one); anything that does not read as a GGUF stays."""
    from ..high.model_card import card, split_parts

    card(path)  # ModelNotFoundError / InvalidModelError: not a model file, nothing deleted
    for part in split_parts(path):
        part.unlink()


def server_url(host: str | None) -> str:
    """The server's URL from --host, else LLAMAPLUG_HOST or OLLAMA_HOST (host[:port], a port or a URL), else
    127.0.0.1:8080."""
    given = host or os.environ.get("LLAMAPLUG_HOST") or os.environ.get("OLLAMA_HOST") or "127.0.0.1:8080"
    if given.lstrip(":").isdigit():  # a port alone ("8212", ":8212"): this machine's, as `serve --port` takes it
        given = f"127.0.0.1:{given.lstrip(':')}"
    return given.rstrip("/") if "://" in given else f"http://{given}"


def _ask_server(args: argparse.Namespace, path: str, body: dict[str, Any] | None = None,
                missing: str | None = None) -> Any:
    """The JSON answer of the server at --host to GET `path` (POST `body`); `missing`: the message of its 404."""
    import urllib.error  # here: 40 ms of imports (http, email) that every other command's start would pay
    import urllib.request

    url = server_url(args.host) + path
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        headers["Content-Type"] = "application/json"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=60) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and missing is not None:
            raise InvalidParameterError(missing, field="model") from None
        raise InvalidParameterError(f"{url}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}",
                                    field="host") from None
    except (urllib.error.URLError, OSError) as exc:
        raise InvalidParameterError(f"cannot reach {url}: {exc}: is `llamaplug serve` running there?",
                                    field="host") from None


def cmd_stop(args: argparse.Namespace) -> int:
    # Ollama's `stop`: an empty generate request with keep_alive 0, silent when done
    _ask_server(args, "/api/generate", {"model": args.model, "keep_alive": 0},
                missing=f"couldn't find model {args.model!r} to stop (`llamaplug ps` lists the loaded ones)")
    return 0


def cmd_ps(args: argparse.Namespace) -> int:
    models = _ask_server(args, "/api/ps")["models"]
    rows = [("NAME", "SIZE", "CONTEXT", "UNTIL")]
    for m in models:
        until = m.get("expires_at", "")
        if until.startswith("9999"):
            until = "Forever"
        else:
            with_tz = datetime.datetime.fromisoformat(until.replace("Z", "+00:00"))
            until = f"{max(0, int(with_tz.timestamp() - time.time()))} seconds from now"
        rows.append((m["name"], _size(m["size"]), str(m.get("context_length", "")), until))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    return 0


def add_model_commands(sub: argparse._SubParsersAction) -> None:
    """pull, list, show, rm, ps and stop on the `llamaplug` parser."""
    where = "org/repo[:TAG] (TAG: a quantization such as Q4_K_M, Q8_0; hf.co/org/repo[:TAG] too)"
    pull = sub.add_parser("pull", help="download a GGUF model from the Hugging Face Hub into its cache")
    pull.add_argument("model", help=where)
    pull.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    pull.set_defaults(func=cmd_pull)
    listing = sub.add_parser("list", aliases=["ls"], help="every model `run` takes by name: the installed catalog "
                             "models and the GGUF models in the Hugging Face cache")
    listing.set_defaults(func=cmd_list)
    show = sub.add_parser("show", help="what a model is: architecture, parameters, quantization, ...")
    show.add_argument("model", help=f"a GGUF file, a catalog name or a cached {where}")
    show.add_argument("--template", action="store_true", help="print its chat template only")
    show.set_defaults(func=cmd_show)
    rm = sub.add_parser("rm", help="delete models: from the Hugging Face cache, or a GGUF file")
    rm.add_argument("model", nargs="+", help=f"{where} (without a TAG the whole repository), or a GGUF file")
    rm.set_defaults(func=cmd_rm)
    ps = sub.add_parser("ps", help="the models a running `llamaplug serve` has loaded")
    stop = sub.add_parser("stop", help="unload a model from a running `llamaplug serve` (it stays served: its next "
                          "request loads it again)")
    stop.add_argument("model", help="its name on that server, as `ps` lists it")
    for parser in (ps, stop):
        parser.add_argument("--host", help="its address: host[:port], a port of this machine or a URL (default: "
                            "LLAMAPLUG_HOST, OLLAMA_HOST or 127.0.0.1:8080)")
        parser.add_argument("--api-key", help="the server's --api-key")
    ps.set_defaults(func=cmd_ps)
    stop.set_defaults(func=cmd_stop)
