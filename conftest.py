"""The suite's shared fixtures, and the pure-Python probes of plugins that are not installed.

The fixtures (tests/llamaplug_testing/pytest_fixtures.py) are loaded here, the one conftest above
every test folder, so that the plugins' tests get them too.

The CUDA, ROCm and Metal plugins cannot be built in CI, but their probes'
decision tables are tested there, from the source folders. An installed
plugin is never shadowed by its source folder: the installed one carries its
build (modules, _build_info) and is what its own tests must see. plugins/_template
has no package (its files end in .tmpl), so nothing of it lands on sys.path.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

pytest_plugins = ["llamaplug_testing.pytest_fixtures", "llamaplug_testing.ci_skips", "llamaplug_testing.isolation"]

for _src in sorted(Path(__file__).parent.glob("plugins/*/src")):
    _packages = [p.name for p in _src.iterdir() if (p / "__init__.py").exists()]
    if _packages and all(importlib.util.find_spec(name) is None for name in _packages):
        sys.path.append(str(_src))
