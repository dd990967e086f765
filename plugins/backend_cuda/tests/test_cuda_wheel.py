"""The installed CUDA plugin as built (runs without a GPU; skipped where the plugin is not installed).

CI does not build it (an hour of nvcc on 2 cores): `make cuda` installs it, and these
tests then check what the build promises: which libraries the module imports, that the
CUDA runtime and cuBLAS resolve from the nvidia-* wheels, and that without a driver the
probe names the reason and the CPU backend runs.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from llamaplug_testing import run_isolated


def _installed() -> tuple[Path, dict[str, str]] | None:
    try:
        dist = importlib.metadata.distribution("llamaplug-backend-cuda")
    except importlib.metadata.PackageNotFoundError:
        return None
    files = [Path(dist.locate_file(f)) for f in dist.files or []]
    module = next((f for f in files if f.name.startswith("libggml-cuda")), None)
    info = next((f for f in files if f.name == "_build_info.py"), None)
    if module is None or info is None:
        return None
    values = dict(re.findall(r'^(\w+) = "([^"]*)"', info.read_text(), re.M))
    return module, values


INSTALLED = _installed()
pytestmark = pytest.mark.skipif(INSTALLED is None, reason="llamaplug-backend-cuda is not installed (make cuda)")


def dynamic_section(module: Path) -> tuple[list[str], list[str]]:
    out = subprocess.run(["readelf", "-d", str(module)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", out)
    paths = re.findall(r"\((?:RUNPATH|RPATH)\).*\[(.+)\]", out)
    return needed, (paths[0].split(":") if paths else [])


def test_module_imports_the_runtime_and_cublas_and_the_cores_ggml_base():
    module, info = INSTALLED
    needed, _ = dynamic_section(module)
    for lib in ("libcudart.so.13", "libcublas.so.13", "libggml-base.so"):
        assert lib in needed, needed
    # the variant decides whether the driver library is imported at load time
    assert ("libcuda.so.1" in needed) == (info["CUDA_VARIANT"] == "vmm"), (info, needed)
    # The release wheel carries 80-real;90-real;90-virtual (the CMakeLists default); the GPU kit's (make gpu-kit)
    # 90-real alone, for the H100/H200 it runs on. Either way Hopper runs it.
    assert {"90-real", "90-virtual"} & set(info["CUDA_ARCHITECTURES"].split(";")), info


def test_runtime_libraries_resolve_from_the_nvidia_wheels():
    module, _ = INSTALLED
    needed, runpath = dynamic_section(module)
    origin = str(module.parent)
    dirs = [Path(p.replace("$ORIGIN", origin)).resolve() for p in runpath]
    for lib in ("libcudart.so.13", "libcublas.so.13", "libggml-base.so"):
        assert lib in needed
        where = [d for d in dirs if (d / lib).exists()]
        assert where, f"{lib} is in none of the module's RUNPATH folders {dirs}"
        if lib != "libggml-base.so":  # from the nvidia-* wheels, not a system toolkit
            assert "site-packages/nvidia" in str(where[0]), where


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia"), reason="an NVIDIA driver is here: test_cuda.py")
def test_without_a_driver_the_probe_says_why_and_cpu_runs():
    code = ("import dataclasses, json, llamaplug as lp; b = lp.LlamaBackend.init(); "
            "print(json.dumps([dataclasses.asdict(s) for s in b.backends()]))")
    done = run_isolated(code, env={"LLAMAPLUG_BACKENDS": None})
    assert done.returncode == 0, done.stderr[-2000:]
    statuses = {s["name"]: s for s in json.loads(done.stdout.strip().splitlines()[-1])}
    cuda = statuses["cuda"]
    assert not cuda["ok"] and not cuda["loaded"]
    assert "no NVIDIA driver" in cuda["reason"] and "libcuda.so.1" in cuda["reason"], cuda
    assert statuses["cpu"]["loaded"]
