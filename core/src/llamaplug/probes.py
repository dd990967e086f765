"""Helpers for backend plugins: find their modules, run risky probes out of process.

A probe that touches a GPU driver may crash or hang; `isolated` runs it in a
child interpreter with a timeout, so the verdict is "crashed" or "timed out"
instead of a dead caller. Verdicts are cached for the life of the process.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .plugins import BackendSpec, ProbeResult

_MARK = "LLAMAPLUG-PROBE "
_SUFFIX = ".dll" if sys.platform == "win32" else ".so"


def module_files(lib_dir: Path, name: str) -> list[Path]:
    """The ggml backend modules for `name` (e.g. "rpc", "vulkan") a plugin ships in `lib_dir`."""
    return sorted(lib_dir.glob(f"*ggml-{name}*{_SUFFIX}"))


@functools.cache
def isolated(module: str, function: str, timeout: float = 30.0) -> dict[str, Any]:
    """`module.function()` (returning a JSON-able dict with ok/reason) run in a child interpreter."""
    code = (f"import importlib, json; r = importlib.import_module({module!r}).{function}(); "
            f"print({_MARK!r} + json.dumps(r))")
    env = dict(os.environ, LLAMAPLUG_LOG="none")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"ok": False, "reason": f"probe {module}.{function} timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        how = f"exit code {done.returncode}"
        if done.returncode < 0:
            how = f"signal {signal.Signals(-done.returncode).name}"
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "reason": f"probe {module}.{function} crashed ({how}): {last}"}
    for line in done.stdout.splitlines():
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    return {"ok": False, "reason": f"probe {module}.{function} printed no verdict"}


def module_backend(
    *,
    name: str,
    distribution: str,
    priority: int,
    lib_dir: Path,
    build_info: Any,
    check: Callable[[], dict[str, Any]] | None = None,
    module: str | None = None,
) -> BackendSpec:
    """A BackendSpec for a plugin that ships ggml module(s) named ggml-<module> (default: the name).

    `check` says whether the hardware/driver is there: {"ok", "reason", "devices"}.
    """
    module = module or name

    def probe() -> ProbeResult:
        found = module_files(lib_dir, module)
        if not found:
            return ProbeResult(False, f"no ggml-{module} module in {lib_dir}: reinstall {distribution}")
        verdict = check() if check else {"ok": True, "reason": "no hardware needed"}
        return ProbeResult(bool(verdict["ok"]), str(verdict["reason"]), tuple(verdict.get("devices", ())),
                           verdict.get("variant"), tuple(found) if verdict["ok"] else ())

    return BackendSpec(name=name, distribution=distribution, priority=priority, probe=probe,
                       llama_cpp_commit=build_info.LLAMA_CPP_COMMIT, ggml_version=build_info.GGML_VERSION)
