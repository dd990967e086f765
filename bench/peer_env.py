#!/usr/bin/env python3
"""The peer: llama-cpp-python==0.3.36 from the registry, in its own cached venv.

llama-cpp-python 0.3.36 vendors the same llama.cpp commit llamaplug pins, so it
is the like-for-like Python peer. It builds from source (about 10-20 minutes on
2 cores); the build uses one job (CMAKE_BUILD_PARALLEL_LEVEL=1) so the machine
stays usable, and the same x86 CPU-variant flags as llamaplug's host build and
the native tools (GGML_NATIVE=OFF + the host variant's features), so all three
run the same ggml kernels.

Never imported into llamaplug's process: bench/run.py runs bench/worker_peer.py
with this venv's python.

    python bench/peer_env.py            # install if missing, print the venv's python
    python bench/peer_env.py --check    # print it if installed, exit 1 otherwise
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

PEER = "llama-cpp-python"
PEER_VERSION = "0.3.36"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins" / "backend_cpu" / "src" / "llamaplug_backend_cpu"))


def venv_dir() -> Path:
    base = Path(os.environ.get("LLAMAPLUG_CACHE", Path.home() / ".cache" / "llamaplug"))
    return Path(os.environ.get("LLAMAPLUG_BENCH_PEER_VENV", base / "bench-peer-venv"))


def python() -> Path:
    return venv_dir() / "bin" / "python"


def installed_version() -> str | None:
    py = python()
    if not py.exists():
        return None
    # importlib.metadata only: the peer library itself is not loaded here.
    r = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('llama_cpp_python'))"],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def is_installed() -> bool:
    return installed_version() == PEER_VERSION


def cmake_args() -> list[str]:
    """CPU flags of the host variant (as vendor/llama.cpp/native_tools.py builds the reference tools)."""
    args = ["-DLLAVA_BUILD=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=OFF"]
    try:
        import variants

        name = variants.best_variant(variants.cpu_flags())
        features = set(variants.X86_VARIANTS[name])
        args += ["-DGGML_NATIVE=OFF", *(f"-DGGML_{f}={'ON' if f in features else 'OFF'}" for f in variants.CPU_FLAGS)]
    except Exception:  # not x86 / no table: let ggml pick for this machine
        args += ["-DGGML_NATIVE=ON"]
    if shutil.which("ccache"):
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    return args


def install(quiet: bool = False) -> Path:
    if is_installed():
        return python()
    target = venv_dir()
    if not python().exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(target)
    env = dict(os.environ)
    env["CMAKE_ARGS"] = " ".join(cmake_args())
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "1")
    env.setdefault("MAKEFLAGS", "-j1")
    print(f"bench: building {PEER}=={PEER_VERSION} into {target} (one job; 10-20 min on 2 cores)\n"
          f"       CMAKE_ARGS={env['CMAKE_ARGS']}", file=sys.stderr, flush=True)
    cmd = [str(python()), "-m", "pip", "install", "--progress-bar=off",
           f"{PEER}=={PEER_VERSION}"]
    # nice: the build must not steal the cores from whatever else runs here.
    if shutil.which("nice"):
        cmd = ["nice", "-n", "10", *cmd]
    subprocess.run(cmd, check=True, env=env,
                   stdout=subprocess.DEVNULL if quiet else None)
    if not is_installed():
        raise RuntimeError(f"{PEER}=={PEER_VERSION} did not install into {target}")
    return python()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only report whether the peer is installed")
    a = ap.parse_args()
    if a.check:
        if is_installed():
            print(python())
            return 0
        print(f"{PEER}=={PEER_VERSION} is not installed in {venv_dir()}", file=sys.stderr)
        return 1
    print(install())
    return 0


if __name__ == "__main__":
    sys.exit(main())
