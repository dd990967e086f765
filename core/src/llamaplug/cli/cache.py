"""`llamaplug cache list|clear DIR`: what a prompt cache directory (serve --cache-dir) holds, and emptying it."""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def cmd_cache(args: argparse.Namespace) -> int:
    from ..high.disk_store import clear_files, list_files  # (numpy: not at the parser's import)

    directory = Path(args.dir)
    if not directory.is_dir():
        print(f"llamaplug cache: {directory} is not a directory", file=sys.stderr)
        return 1
    if args.cache_command == "clear":
        n, size = clear_files(directory)
        print(f"removed {n} files ({_size(size)}) from {directory}")
        return 0
    files = list_files(directory)
    total = 0
    for path, head in files:
        size = path.stat().st_size if path.exists() else 0
        total += size
        when = datetime.datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y-%m-%d %H:%M") if size else "-"
        if isinstance(head, str):
            print(f"{path.name[:16]}  {_size(size):>10}  {when}  unreadable: {head}")
            continue
        d = head.description
        print(f"{path.name[:16]}  {_size(size):>10}  {when}  {len(head.tokens):>6} tokens  "
              f"{d.get('model_name', '?')} K={d.get('type_k')} V={d.get('type_v')}  llama.cpp {head.llama_cpp[:8]}")
    print(f"{len(files)} files, {_size(total)} in {directory}")
    return 0


def add_cache_commands(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser("cache", help="list or clear a prompt cache directory (serve --cache-dir)")
    words = cache.add_subparsers(dest="cache_command", required=True)
    for word, help_text in (("list", "each file: its tokens, model, KV types, llama.cpp pin, size, last use"),
                            ("clear", "remove every cache file in DIR (nothing else there)")):
        command = words.add_parser(word, help=help_text)
        command.add_argument("dir", help="the cache directory")
        command.set_defaults(func=cmd_cache)
