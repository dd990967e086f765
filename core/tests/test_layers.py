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
    ("llamaplug._version", 0), ("llamaplug._build_info", 0), ("llamaplug.errors", 0),
    ("llamaplug.params", 1), ("llamaplug.raw", 1),
    ("llamaplug.hookspecs", 2), ("llamaplug.plugins", 2), ("llamaplug.probes", 2), ("llamaplug.catalog", 2),
    ("llamaplug.blocks", 3),
    ("llamaplug.plugin_api", 3),  # the blocks' seams published for plugins (and the protocols high/ types against)
    ("llamaplug.high", 4),
    ("llamaplug.cli", 5), ("llamaplug.bench", 5), ("llamaplug", 5),
]
NAMES = ["version/errors", "params/raw", "plugin machinery", "blocks", "high", "cli/bench/facade"]


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


def test_no_import_cycles(graph):
    # Tarjan's strongly connected components: any with more than one module is a cycle.
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

    for v in graph:
        if v not in index:
            connect(v)
    assert not cycles, f"import cycles: {cycles}"


def test_a_planted_cycle_is_found(graph):
    planted = {k: set(v) for k, v in graph.items()}
    planted["llamaplug.blocks.backend"].add("llamaplug.blocks.context")
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycles(planted)
