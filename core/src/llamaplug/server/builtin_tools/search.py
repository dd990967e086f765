"""file_glob_search and grep_search, as llama-server's: `git ls-files` inside a repository (its .gitignore
kept), else a walk that lists but never enters the usual junk folders, 15 s at most; 100 results at most."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
from typing import Any

from .fields import Params
from .files import lines

MAX_RESULTS = 100
LIST_TIMEOUT = 15  # seconds for one listing, git or the walk
GIT_MAX_OUTPUT = 8 * 1024 * 1024
JUNK_DIRS = frozenset((".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build",
                       "target", ".cache", ".idea", ".vscode"))
TYPES = {"file": (True, False), "dir": (False, True), "all": (True, True)}  # (files, dirs)


@functools.lru_cache(maxsize=256)
def _glob(pattern: str) -> re.Pattern[str]:
    """common.cpp's glob_match as a regex: * and ? within a path part, ** across parts, [a-z] / [!a-z] classes."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1:i + 2] in ("]", "-") else i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:end]
                negated = body[:1] in ("!", "^")
                body = body[1:] if negated else body
                out.append("[" + ("^" if negated else "") + "".join("\\" + ch if ch in "\\^[]" else ch
                                                                    for ch in body) + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def path_glob_match(pattern: str, rel: str) -> bool:
    """llama-server's: a pattern with no '/' matches the base name at any depth, else the whole relative path
    (anchored with **/ unless it starts with **, **/ or /)."""
    if "/" not in pattern:
        return _glob(pattern).fullmatch(rel.rsplit("/", 1)[-1]) is not None
    if not (pattern == "**" or pattern.startswith(("**/", "/"))):
        pattern = "**/" + pattern
    return _glob(pattern).fullmatch(rel) is not None


def list_entries(base: str, max_depth: int, files: bool, dirs: bool) -> tuple[list[tuple[str, bool]], bool] | str:
    """([(relative path, is a folder)], truncated) under the folder `base`; the error text where it is none."""
    if not os.path.isdir(base):
        return "path does not exist or is not a directory"
    deadline = time.monotonic() + LIST_TIMEOUT
    if files and not dirs:  # git lists no folders
        listed = _git_files(base)
        if listed is not None:
            return [(rel, False) for rel in listed if (max_depth == 0 or rel.count("/") + 1 <= max_depth)
                    and os.path.isfile(os.path.join(base, rel))], False
    found: list[tuple[str, bool]] = []
    stack = [(base, "", 0)]
    truncated = False
    while stack:
        folder, rel_folder, depth = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            truncated = True
            continue
        for entry in entries:
            if time.monotonic() >= deadline:
                return found, True
            rel = f"{rel_folder}/{entry.name}" if rel_folder else entry.name
            try:
                is_dir = entry.is_dir()
                if is_dir:
                    if dirs:
                        found.append((rel, True))
                    # a junk folder stays listed but is never entered; a link may loop back, so never followed
                    if entry.name not in JUNK_DIRS and not entry.is_symlink() and (max_depth == 0
                                                                                   or depth + 1 < max_depth):
                        stack.append((entry.path, rel, depth + 1))
                elif files and entry.is_file():
                    found.append((rel, False))
            except OSError:
                continue
    return found, truncated


def _git_files(base: str) -> list[str] | None:
    try:
        done = subprocess.run(["git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
                              capture_output=True, timeout=LIST_TIMEOUT, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or len(done.stdout) > GIT_MAX_OUTPUT:
        return None
    text = done.stdout.decode("utf-8", "surrogateescape")
    return [line.rstrip("\r").replace("\\", "/") for line in text.split("\n") if line.rstrip("\r")]


def file_glob_search(params: Params) -> dict[str, Any]:
    path = params.string("path")
    base = params.resolve(path)
    include, exclude = params.string("include", "**"), params.string("exclude", "")
    kind = params.string("type", "file")
    max_depth = max(0, params.integer("max_depth", 0))
    limit = params.integer("limit", MAX_RESULTS)
    if limit < 1:
        return {"error": f"invalid limit: {limit} (expected 1 or more)"}
    limit = min(limit, MAX_RESULTS)
    if kind not in TYPES:
        return {"error": f'invalid type: {kind} (expected "file", "dir" or "all")'}
    listing = list_entries(base, max_depth, *TYPES[kind])
    if isinstance(listing, str):
        return {"error": f"{listing}: {path}"}
    entries, truncated = listing
    matches = [(rel, is_dir) for rel, is_dir in entries
               if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))]
    shown = matches[:limit]
    text = "".join(rel + ("/" if is_dir else "") + "\n" for rel, is_dir in shown)
    text += f"\n---\nTotal matches: {len(matches)}\n"
    if len(matches) > len(shown):
        text += (f"[{len(shown)} results limit reached ({len(matches)} total matches). Refine the glob pattern to "
                 "narrow the search.]\n")
    if truncated:
        text += "[results truncated: time budget or unreadable directory]\n"
    # `base` absolute, so a client (the web UI's picker) can join the relative entries
    return {"plain_text_response": text, "base": base,
            "entries": [{"path": rel, "type": "dir" if is_dir else "file"} for rel, is_dir in shown]}


_SPECIALS = set("\\^$.|?*+()[]{}")


def grep_search(params: Params) -> dict[str, Any]:
    path, pattern = params.string("path"), params.string("pattern")
    include, exclude = params.string("include", "**"), params.string("exclude", "")
    numbered = params.boolean("return_line_numbers")
    literal, ignore_case = params.boolean("literal"), params.boolean("ignore_case")
    context = max(0, params.integer("context_lines", 0))
    if literal:
        pattern = "".join("\\" + c if c in _SPECIALS else c for c in pattern)
    try:
        regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        return {"error": f"invalid regex: {exc}"}
    full = params.resolve(path)
    if os.path.isfile(full):
        targets = [(full, path)]
    elif os.path.isdir(full):
        listing = list_entries(full, 0, True, False)
        if isinstance(listing, str):
            return {"error": f"{listing}: {path}"}
        targets = [(os.path.join(full, rel), rel) for rel, _ in listing[0]
                   if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))]
    else:
        return {"error": "path does not exist: " + path}
    out: list[str] = []
    total, limit_reached = 0, False
    numbered = numbered or context > 0
    for target, shown in targets:
        if limit_reached:
            break
        try:
            with open(target, "rb") as f:
                text = [line.decode("utf-8", "replace") for line in lines(f.read())]
        except OSError:
            continue
        for i, line in enumerate(text):
            if total >= MAX_RESULTS:
                limit_reached = True
                break
            if not regex.search(line):
                continue
            for j in range(max(0, i - context), min(len(text) - 1, i + context) + 1):
                mark = ":" if j == i else "-"
                out.append(f"{shown}{mark}{f'{j + 1}{mark}' if numbered else ''}{text[j]}\n")
            if context > 0:
                out.append("--\n")
            total += 1
    out.append(f"\n---\nTotal matches: {total}\n")
    if limit_reached:
        out.append(f"[{MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]\n")
    return {"plain_text_response": "".join(out)}
