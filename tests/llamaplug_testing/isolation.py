"""What a test file must not leave changed for the next file of its pytest process, checked after every file.

Under `pytest -n 2 --dist loadfile` which files share a worker process, and their order, change from run to run:
state one file leaves behind makes another file's result depend on that draw (CI lost a fuzz slice to a cached GGUF
that test_inspect.py edited; an in-process `serve` left the root logger at ERROR and later caplog checks saw
nothing). `file_leaves_no_trace`, autouse for every test module (the root conftest loads this module), compares
what costs microseconds to compare, after the file's own fixtures are torn down: the environment variables that
llamaplug and llama.cpp read, the plugin manager's plugins, the root logger's level and handlers, the working
folder. A change fails the file's last test with what changed, and is put back: the next file starts as usual.

State set once per process on purpose (the backend, the plugins' first load, sys.path at collection) is not checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

ENV_PREFIXES = ("LLAMAPLUG_", "LLAMA_", "GGML_", "XDG_")


@dataclasses.dataclass
class Snapshot:
    env: dict[str, str]
    plugins: dict[str, Any] | None  # None until the plugins' first load (loading them is no leak)
    root_level: int
    root_handlers: list[logging.Handler]
    cwd: str


def snapshot() -> Snapshot:
    root = logging.getLogger()
    return Snapshot({k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}, _plugins(), root.level,
                    list(root.handlers), os.getcwd())


def _plugins() -> dict[str, Any] | None:
    plugins = sys.modules.get("llamaplug.plugins")
    if plugins is None or not plugins._loaded:
        return None
    return dict(plugins.pm.list_name_plugin())


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What differs, in words (a plugin's order in the manager is not compared: the hooks' results are by name)."""
    found = [f"${k}: {before.env.get(k)!r} -> {after.env.get(k)!r}" for k in sorted(before.env.keys() | after.env)
             if before.env.get(k) != after.env.get(k)]
    if before.plugins is not None and after.plugins is not None:
        found += [f"plugin {n!r} registered" for n in after.plugins.keys() - before.plugins.keys()]
        found += [f"plugin {n!r} unregistered" for n in before.plugins.keys() - after.plugins.keys()]
        found += [f"plugin {n!r} replaced" for n in before.plugins.keys() & after.plugins.keys()
                  if before.plugins[n] is not after.plugins[n]]
    if before.root_level != after.root_level:
        found.append(f"root logger level {logging.getLevelName(before.root_level)} -> "
                     f"{logging.getLevelName(after.root_level)}")
    if {id(h) for h in before.root_handlers} != {id(h) for h in after.root_handlers}:
        found.append(f"root logger handlers {[type(h).__name__ for h in before.root_handlers]} -> "
                     f"{[type(h).__name__ for h in after.root_handlers]}")
    if before.cwd != after.cwd:
        found.append(f"working folder {before.cwd} -> {after.cwd}")
    return found


def restore(before: Snapshot) -> None:
    for key in {k for k in os.environ if k.startswith(ENV_PREFIXES)} - before.env.keys():
        del os.environ[key]
    os.environ.update(before.env)
    now = _plugins()
    if before.plugins is not None and now is not None:
        from llamaplug.plugins import pm

        for name, plugin in now.items():
            if before.plugins.get(name) is not plugin:
                pm.unregister(name=name)
        for name, plugin in before.plugins.items():
            if now.get(name) is not plugin:
                pm.register(plugin, name=name)
    put_back_logging(before.root_level, before.root_handlers)
    os.chdir(before.cwd)


def put_back_logging(level: int, handlers: list[logging.Handler]) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="module", autouse=True)
def file_leaves_no_trace() -> Iterator[None]:
    before = snapshot()
    yield
    found = changes(before, snapshot())
    if found:
        restore(before)
        pytest.fail("this test file left the process changed for the next file in it (put back now): "
                    + "; ".join(found), pytrace=False)


@contextlib.contextmanager
def serve_logging_put_back() -> Iterator[None]:
    """For a test that runs `llamaplug serve` in this process (`main(["serve", ...])`): serve_log.configure gives the
    whole process a server's logging (the root's handlers replaced by its writer, the root at --log's level, ERROR
    by default, its own loggers at INFO), which stays after main() returns, failed serve or not."""
    from llamaplug.cli import serve_log

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    own = {name: logging.getLogger(name).level for name in serve_log._OWN}
    try:
        yield
    finally:
        for handler in root.handlers:
            if isinstance(handler, serve_log._Behind):
                handler.finish()  # its writer thread ends
        put_back_logging(level, handlers)
        for name, own_level in own.items():
            logging.getLogger(name).setLevel(own_level)
