"""The core's import graph: no cycles, and no lower layer imports a higher one.

Read from the source (every import, at module level or inside a function; the
ones under ``if TYPE_CHECKING:`` are for type checkers only and do not count),
so the rule holds without importing anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "llamaplug"

# A module's layer, from its path (the first rule that matches). A module may import
# its own layer and the ones below it.
LAYERS = [
    ("llamaplug._version", 0), ("llamaplug._build_info", 0), ("llamaplug._lazy", 0), ("llamaplug.errors", 0),
    ("llamaplug.params", 1), ("llamaplug.raw", 1),
    ("llamaplug.hookspecs", 2), ("llamaplug.plugins", 2), ("llamaplug.probes", 2), ("llamaplug.catalog", 2),
    ("llamaplug.blocks", 3),
    ("llamaplug.plugin_api", 3),  # the blocks' seams published for plugins (and the protocols high/ types against)
    ("llamaplug.high", 4),
    ("llamaplug.cli", 5), ("llamaplug.bench", 5),
    ("llamaplug.compat", 6),  # other libraries' APIs over the public one: nothing in llamaplug imports them
    ("llamaplug", 5),
]
NAMES = ["version/errors", "params/raw", "plugin machinery", "blocks", "high", "cli/bench/facade", "compat"]


def layer(module: str) -> int:
    for prefix, rank in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return rank
    raise AssertionError(f"{module} has no layer: add it to LAYERS")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def known(name: str) -> bool:
    base = PACKAGE.parent.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: Path) -> set[str]:
    """The llamaplug modules `path` imports at run time."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "llamaplug")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "llamaplug":
                return
            for alias in node.names:  # `from .. import plugins` imports a module, not a name
                sub = f"{target}.{alias.name}"
                found.add(sub if known(sub) else target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    found.discard(me)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py")) if "build" not in p.parts}


def test_the_graph_was_read(graph):
    assert "llamaplug.blocks.context" in graph["llamaplug.high.llama"]
    assert "llamaplug.raw" in graph["llamaplug.blocks.model"]


def test_no_lower_layer_imports_a_higher_one(graph):
    bad = [f"{m} ({NAMES[layer(m)]}) imports {t} ({NAMES[layer(t)]})"
           for m, targets in graph.items() for t in sorted(targets) if layer(t) > layer(m)]
    assert not bad, "\n".join(bad)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components: each with more than one module is a cycle (bench/architecture_counts.py
    counts them too)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in list(graph):
        if v not in index:
            connect(v)
    return cycles


def test_no_import_cycles(graph):
    cycles = import_cycles(graph)
    assert not cycles, f"import cycles: {cycles}"


def test_a_planted_cycle_is_found(graph):
    planted = {k: set(v) for k, v in graph.items()}
    planted["llamaplug.blocks.backend"].add("llamaplug.blocks.context")
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycles(planted)


# Who may import the raw layer (llamaplug.raw) at run time: the building blocks, which wrap
# every native call, and raw itself. The facade (llamaplug/__init__.py) may import it to publish
# `llamaplug.raw` for seed 003's raw flow. Nothing else: high/, the server, the CLI, the bench and
# the plugin machinery reach llama.cpp through methods of the blocks (LlamaModel, LlamaContext, ...).
RAW = "llamaplug.raw"
MAY_TOUCH_RAW = ("llamaplug.blocks", RAW)
FACADE = "llamaplug"


def raw_importers(graph: dict[str, set[str]]) -> list[str]:
    """Modules outside MAY_TOUCH_RAW (and the facade) that import the raw layer, with what they import."""
    return [f"{m} imports {t}" for m, targets in sorted(graph.items())
            if m != FACADE and not any(m == p or m.startswith(p + ".") for p in MAY_TOUCH_RAW)
            for t in sorted(targets) if t == RAW or t.startswith(RAW + ".")]


def test_only_the_blocks_import_raw(graph):
    bad = raw_importers(graph)
    assert not bad, "only llamaplug.blocks may import llamaplug.raw:\n" + "\n".join(bad)


def test_a_planted_raw_import_is_found(graph):
    planted = {k: set(v) for k, v in graph.items()}
    planted["llamaplug.high.completion"].add(RAW)
    assert f"llamaplug.high.completion imports {RAW}" in raw_importers(planted)


# -- the core and its plugins ------------------------------------------------------
# The core never imports a plugin package: what it needs from one comes through a hook. A plugin
# imports the core's public names and its plugin API only (CONVENTIONS.md). Both are read from the
# source at every place: module level, inside functions, under TYPE_CHECKING, and importlib calls
# with a literal name.

PLUGINS = SRC.parents[1] / "plugins"

# What a plugin may import of the core, module by module (any name in them not starting with "_"),
# plus the top-level names of llamaplug.__all__.
PLUGIN_MAY_IMPORT = {
    "llamaplug.plugin_api",  # the documented plugin API: hookimpl, NativeHandle, native log, error mapping
    "llamaplug.raw",  # the cffi layer (README), for a plugin whose native library takes llama.h's types
    "llamaplug.hookspecs", "llamaplug.probes", "llamaplug.catalog",  # the hooks and what they register
    "llamaplug.errors", "llamaplug.params",  # the exceptions and the parameter models
}
_IMPORT_CALLS = {"import_module", "find_spec", "__import__"}


def named_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of every absolute import in `path`; name is None for `import module`."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in _IMPORT_CALLS:
                found.append((node.lineno, node.args[0].value, None))
    return sorted(found, key=lambda f: f[0])


def plugin_imports(paths: list[Path]) -> list[str]:
    """Where `paths` import a plugin package (llamaplug_*)."""
    return [f"{_shown(p)}:{line}: {module}" for p in paths for line, module, _ in named_imports(p)
            if module.split(".")[0].startswith("llamaplug_")]


def _top_level_names() -> set[str]:
    """llamaplug.__all__, read from the source."""
    for node in ast.parse((PACKAGE / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("llamaplug/__init__.py has no __all__")


def core_imports_outside_the_plugin_api(paths: list[Path]) -> list[str]:
    """Where `paths` import more of the core than public names and the plugin API."""
    top = _top_level_names()
    bad = []
    for p in paths:
        for line, module, name in named_imports(p):
            if module.split(".")[0] != "llamaplug":
                continue
            if module == "llamaplug" and name is not None and not known(f"llamaplug.{name}"):
                ok = name in top  # `from llamaplug import Llama`
            else:
                if module == "llamaplug" and name is not None:  # `from llamaplug import raw` is a module
                    module, name = f"llamaplug.{name}", None
                ok = module == "llamaplug" or (module in PLUGIN_MAY_IMPORT and not (name or "").startswith("_"))
            if not ok:
                bad.append(f"{_shown(p)}:{line}: {module}" + (f" import {name}" if name else ""))
    return bad


def _shown(path: Path) -> Path:
    return path.relative_to(SRC.parents[1]) if path.is_relative_to(SRC.parents[1]) else path


def _sources(root: Path) -> list[Path]:
    return [p for p in sorted(root.rglob("*.py")) if "build" not in p.parts]


def test_the_core_imports_no_plugin_package():
    bad = plugin_imports(_sources(PACKAGE))
    assert not bad, "the core imports a plugin package (what it needs from one comes through a hook):\n" + \
        "\n".join(bad)


def test_plugins_import_only_public_core_names_and_the_plugin_api():
    if not PLUGINS.is_dir():
        pytest.skip(f"no plugins folder beside the core ({PLUGINS}): the core alone")
    paths = [p for src in sorted(PLUGINS.glob("*/src")) for p in _sources(src)]
    assert len({p.parts[len(PLUGINS.parts)] for p in paths}) >= 2, "the plugins' sources were not found"
    bad = core_imports_outside_the_plugin_api(paths)
    assert not bad, "a plugin imports more of the core than its public names and llamaplug.plugin_api:\n" + \
        "\n".join(bad)


PLANTED = """
import importlib
from typing import TYPE_CHECKING

import llamaplug
from llamaplug import Llama, raw
from llamaplug.errors import native_error
if TYPE_CHECKING:
    from llamaplug_tokenizer_hf import HFTokenizer

def later():
    import llamaplug_mtmd.context
    from llamaplug.blocks import _native_log
    from llamaplug.errors import _DECODE_CODES
    from llamaplug import _version, blocks
    return importlib.util.find_spec("llamaplug_mtmd"), importlib.import_module("llamaplug.blocks.model")
"""


def test_planted_plugin_and_private_imports_are_found(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(PLANTED)
    assert [b.split(": ", 1)[1] for b in plugin_imports([planted])] == [
        "llamaplug_tokenizer_hf", "llamaplug_mtmd.context", "llamaplug_mtmd"]
    assert [b.split(": ", 1)[1] for b in core_imports_outside_the_plugin_api([planted])] == [
        "llamaplug.blocks import _native_log", "llamaplug.errors import _DECODE_CODES", "llamaplug._version",
        "llamaplug.blocks", "llamaplug.blocks.model"]


def foreign_private_attributes(paths: list[Path], root: Path = PLUGINS) -> list[str]:
    """`obj._name` in `paths` where obj is not self/cls and no file of `paths` defines `_name` itself.

    A plugin reaches the core's objects through their public methods (`raw_handle()`, `vocab_handle()`,
    `add_dependent()`, `note_decoded()`, ...); private names of its own classes are its business. By name:
    a name the plugin defines for itself (a `_ptr` property of its own handle class) passes everywhere.
    """
    trees = [(p, ast.parse(p.read_text(), str(p))) for p in paths]
    own: set[str] = set()
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                own.add(node.attr)
    bad = []
    for p, tree in trees:
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    and node.attr not in own):
                bad.append(f"{p.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return bad


def test_plugins_use_no_private_attribute_of_the_core():
    if not PLUGINS.is_dir():
        pytest.skip(f"no plugins folder beside the core ({PLUGINS}): the core alone")
    bad = [line for src in sorted(PLUGINS.glob("*/src")) for line in foreign_private_attributes(_sources(src))]
    assert not bad, "a plugin reads a private attribute of a core object:\n" + "\n".join(bad)


def test_a_planted_private_attribute_is_found(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("class A:\n    _kind = 'a'\n\n"
                    "def f(model, a):\n    return model._vocab_ptr, a._kind, model.raw_handle()\n")
    assert foreign_private_attributes([mine], tmp_path) == ["mine.py:5: model._vocab_ptr"]


# -- compat ---------------------------------------------------------------------------
# llamaplug.compat (llama-cpp-python's API, ...) is built on llamaplug's public API only: no private module or
# name imported, no private attribute of another object read (its own classes' private names are its business).
COMPAT = PACKAGE / "compat"


def private_imports(paths: list[Path]) -> list[str]:
    """Imports of a private llamaplug module or name (a part starting with "_") in `paths`."""
    return [f"{_shown(p)}:{line}: {module}" + (f" import {name}" if name else "")
            for p in paths for line, module, name in named_imports(p)
            if module.split(".")[0] == "llamaplug"
            and any(_private(part) for part in module.split(".") + [name or ""])]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))  # __version__ is public


def test_compat_uses_public_names_only():
    paths = _sources(COMPAT)
    assert paths, f"no sources in {COMPAT}"
    bad = private_imports(paths) + foreign_private_attributes(paths, SRC)
    assert not bad, "llamaplug.compat reaches past the public API:\n" + "\n".join(bad)


def test_a_planted_private_import_in_compat_is_found(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from llamaplug.blocks import _native_log\nfrom llamaplug.high.llama import Llama\n"
                       "import llamaplug._version\n\ndef f(llama):\n    return llama._engine\n")
    assert [b.split(": ", 1)[1] for b in private_imports([planted])] == [
        "llamaplug.blocks import _native_log", "llamaplug._version"]
    assert foreign_private_attributes([planted], tmp_path) == ["planted.py:6: llama._engine"]


# -- the server's API families ----------------------------------------------------------
# One package per API family under llamaplug.server; a route module (one that builds a router) imports no other
# route module: what two of them share lives in a module that is no route (server/shared.py, a family's common.py).


def route_modules() -> set[str]:
    return {module_name(p) for p in sorted((PACKAGE / "server").rglob("*.py"))
            if any(line.split("=")[0].strip().endswith("router") and "router(" in line
                   for line in p.read_text().splitlines() if not line.startswith((" ", "#")))}


def routes_importing_routes(graph: dict[str, set[str]], routes: set[str]) -> list[str]:
    return [f"{m} imports {t}" for m in sorted(routes) for t in sorted(graph.get(m, ())) if t in routes]


def test_no_route_module_imports_another(graph):
    routes = route_modules()
    assert "llamaplug.server.openai.chat" in routes and "llamaplug.server.native.completion" in routes
    bad = routes_importing_routes(graph, routes)
    assert not bad, "a route module imports another (move what they share to server/shared.py):\n" + "\n".join(bad)


def test_a_planted_route_import_is_found(graph):
    planted = {k: set(v) for k, v in graph.items()}
    planted["llamaplug.server.openai.chat"].add("llamaplug.server.anthropic.messages")
    assert routes_importing_routes(planted, route_modules()) == [
        "llamaplug.server.openai.chat imports llamaplug.server.anthropic.messages"]


def routes_reaching_routes(graph: dict[str, set[str]], routes: set[str]) -> list[str]:
    """Route modules that reach another through modules that are no route (a helper that imports a route)."""
    found = []
    for start in sorted(routes):
        seen, todo, hit = {start}, [t for t in graph.get(start, ()) if t not in routes], set()
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            for t in graph.get(m, ()):
                if t in routes and t != start:
                    hit.add(t)
                elif t not in routes:
                    todo.append(t)
        found += [f"{start} reaches {t}" for t in sorted(hit)]
    return found


def test_no_route_module_reaches_another_through_a_helper(graph):
    """Issue 44 part 3: /v1/responses' MCP path (server/mcp/responses.py) imported the chat route for its rounds;
    they go through openai/answer.py now, which no route module has to be imported for."""
    bad = routes_reaching_routes(graph, route_modules())
    assert not bad, "a route module reaches another through a helper:\n" + "\n".join(bad)


def test_a_planted_route_reach_is_found(graph):
    planted = {k: set(v) for k, v in graph.items()}
    planted["llamaplug.server.mcp.loop"].add("llamaplug.server.openai.chat")
    assert "llamaplug.server.responses.routes reaches llamaplug.server.openai.chat" in routes_reaching_routes(
        planted, route_modules())
