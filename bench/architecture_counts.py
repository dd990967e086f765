#!/usr/bin/env python3
"""The architecture counts of issue 44, read from the source (nothing is imported but the layer test's helpers).

    python bench/architecture_counts.py [--json]

- chat engine callers: the places that build a chat's jobs for the engine (calls of high/jobs.py's
  `prepare_chat`; target 1, high/chat_call.py's ChatRun), and beside them the faces that start a chat
  (`start_chat` calls), each of which goes through that one place.
- statuses by hand: an HTTP error status (>= 400) chosen outside STATUS_BY_CLASS: `ApiError(<number>, ...)`,
  `status_code=<number>` or `HTTPException(...)` in the core (target 0).
- routes importing routes: a route module (one that builds a router) importing another, directly (target 0,
  core/tests/test_layers.py's rule) and through modules that are no route (a route reaching another's code).
- import cycles and lower layers importing higher ones: core/tests/test_layers.py's graph (targets 0).
- the largest modules (lines).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "core" / "src" / "llamaplug"


def _layers():
    spec = importlib.util.spec_from_file_location("_test_layers", ROOT / "core" / "tests" / "test_layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sources() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "build" not in p.parts]


def _calls(name: str) -> list[str]:
    """file:line of every call of a function called `name` (a bare name or an attribute)."""
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if called == name:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def statuses_by_hand() -> list[str]:
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if called == "HTTPException":
                found.append(f"{where}: HTTPException")
            if called == "ApiError" and node.args and isinstance(node.args[0], ast.Constant):
                found.append(f"{where}: ApiError({node.args[0].value})")
            for kw in node.keywords:
                value = kw.value
                if (kw.arg in ("status_code", "status") and isinstance(value, ast.Constant)
                        and isinstance(value.value, int) and value.value >= 400):
                    found.append(f"{where}: {kw.arg}={value.value}")
    return found


def counts() -> dict[str, object]:
    layers = _layers()
    graph = {layers.module_name(p): layers.imports(p) for p in _sources()}
    routes = layers.route_modules()
    direct = layers.routes_importing_routes(graph, routes)
    through = layers.routes_reaching_routes(graph, routes)
    upward = [f"{m} imports {t}" for m, targets in graph.items() for t in sorted(targets)
              if layers.layer(t) > layers.layer(m)]
    sizes = sorted(((len(p.read_text().splitlines()), str(p.relative_to(ROOT))) for p in _sources()), reverse=True)
    builders = _calls("prepare_chat")
    return {
        "chat_engine_callers": builders,
        "start_chat_faces": _calls("start_chat"),
        "statuses_by_hand": statuses_by_hand(),
        "routes_importing_routes": direct,
        "routes_reaching_routes_through_other_modules": through,
        "import_cycles": layers.import_cycles(graph),
        "lower_layer_imports_higher": upward,
        "largest_modules": [{"lines": n, "path": p} for n, p in sizes[:5]],
        "route_modules": len(routes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="the whole result as JSON")
    found = counts()
    if parser.parse_args().json:
        print(json.dumps(found, indent=2))
        return
    for key, value in found.items():
        if isinstance(value, list):
            print(f"{key}: {len(value)}")
            for item in value:
                print(f"    {item}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
