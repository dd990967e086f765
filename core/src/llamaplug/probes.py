"""The backend-plugin contract: what a backend plugin registers and what its probe answers.

A plugin's ``llamaplug_register_backends`` hook registers one `BackendSpec` per
backend; the core calls its `probe`, which returns a `ProbeResult` naming the
module files to load (absolute paths inside the plugin's package: the core loads
nothing else). The helpers build specs for plugins that ship ggml modules
(`module_backend`), find those files (`module_files`), ask ggml's own score of a
module (`module_score`), and run a probe that touches a driver in a child
interpreter with a timeout (`isolated`), so a crash or hang is a verdict, not a
dead caller. Verdicts are cached for the life of the process.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """A backend's answer to "can you run here?".

    `mismatch` says the modules were built from another llama.cpp pin than the
    core (reinstalling the plugin fixes it), as opposed to hardware that is not there.
    """

    ok: bool
    reason: str
    devices: tuple[str, ...] = ()
    variant: str | None = None
    modules: tuple[Path, ...] = ()  # the ggml backend modules to load when ok
    mismatch: bool = False


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """A compute backend a plugin ships.

    `probe` must not crash or hang the caller; it returns which module files to
    load. `llama_cpp_commit` is the pin the modules were built from.
    """

    name: str
    distribution: str
    priority: int
    probe: Callable[[], ProbeResult]
    llama_cpp_commit: str
    ggml_version: str


def module_score(path: Path) -> int:
    """ggml's own score of a backend module for this machine (0: cannot run here)."""
    # ctypes, not cffi's ABI mode: its cdef would import pycparser (90 ms of every start) for one call.
    handle = ctypes.CDLL(str(path))
    try:
        score = handle.ggml_backend_score
    except AttributeError:  # modules without variants have no score: they always run
        return 1
    score.argtypes, score.restype = [], ctypes.c_int
    return int(score())


_MARK = "LLAMAPLUG-PROBE "
_SUFFIX = ".dll" if sys.platform == "win32" else ".so"


def module_files(lib_dir: Path, name: str) -> list[Path]:
    """The ggml backend modules for `name` (e.g. "rpc", "vulkan") a plugin ships in `lib_dir`."""
    return sorted(lib_dir.glob(f"*ggml-{name}*{_SUFFIX}"))


_verdicts: dict[tuple[str, str, float], Future[dict[str, Any]]] = {}
_verdicts_lock = threading.Lock()


def isolated(module: str, function: str, timeout: float = 30.0) -> dict[str, Any]:
    """`module.function()` (returning a JSON-able dict with ok/reason) run in a child interpreter, once per
    process: a second caller, even one asking while the child runs (a probe started ahead), gets the same verdict.

    The child runs the module's file alone, not its package: importing a plugin imports llamaplug, which
    would double a probe's cost (and every server's start) for nothing a probe needs. So a probe module
    imports only the standard library.
    """
    key = (module, function, timeout)
    with _verdicts_lock:
        future = _verdicts.get(key)
        mine = future is None
        if mine:
            future = _verdicts[key] = Future()
    if mine:
        try:
            future.set_result(_run_isolated(module, function, timeout))
        except BaseException as exc:  # the callers waiting on it get it too, rather than waiting for good
            future.set_exception(exc)
    return future.result()


def _run_isolated(module: str, function: str, timeout: float) -> dict[str, Any]:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return {"ok": False, "reason": f"probe {module}.{function}: no such module"}
    code = ("import importlib.util as u, json, sys; "
            f"s = u.spec_from_file_location({module!r}, {spec.origin!r}); m = u.module_from_spec(s); "
            f"sys.modules[{module!r}] = m; s.loader.exec_module(m); r = m.{function}(); "
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
