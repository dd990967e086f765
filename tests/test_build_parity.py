"""Each backend plugin compiles ggml's backend with the flags llama.cpp's own build of the pin uses.

A plugin adds ggml/ directly, where llama.cpp's top-level CMakeLists would have set options first:
`GGML_CUDA_GRAPHS` was one (on in llama.cpp, off in ggml alone), and the CUDA module ran without
graphs at 0.45x native tg on an H100 before anyone looked. So, configure only (nothing is compiled,
seconds a backend): the plugin's CMake, and llama.cpp's with the same backend option as
vendor/llama.cpp/native_tools.py builds the reference tools, each writing compile_commands.json;
every source of the backend must get the same compiler, definitions and flags on both sides.
Paths are compared relative to the pinned tree and to each build folder. A difference that is
meant goes into ACCEPTED with its reason; there is none today.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from llamaplug_testing import REPO

import native_tools

# backend -> (plugin folder, ggml's backend source folder, native_tools.cmake_args, the plugin build's environment)
BACKENDS = {
    "cpu": ("backend_cpu", "ggml-cpu", {"backend": "cpu"}, {"LLAMAPLUG_CPU_VARIANTS": "host"}),
    # The release wheels' CPU modules, one per x86 variant, against llama.cpp's GGML_CPU_ALL_VARIANTS build.
    "cpu-all": ("backend_cpu", "ggml-cpu", {"backend": "cpu", "cpu_variants": "all"},
                {"LLAMAPLUG_CPU_VARIANTS": "all"}),
    "rpc": ("backend_rpc", "ggml-rpc", {"backend": "rpc"}, {}),
    "vulkan": ("backend_vulkan", "ggml-vulkan", {"backend": "vulkan"}, {}),
    "cuda": ("backend_cuda", "ggml-cuda", {"backend": "cuda"}, {}),
}
# The CUDA architectures are an explicit choice on both sides (the release wheel's list, `native` for the tools):
# both are configured for sm_90 alone, the GPU kit's, which also keeps nvcc's compiler checks short.
CUDA_ARCHITECTURES = "90-real"
# (backend, flag) -> why the plugin differs from llama.cpp's own build on purpose (a flag on one side only, or in
# another place: the comparison leaves these out on both sides).
ACCEPTED: dict[tuple[str, str], str] = {
    ("cuda", "-isystem <cublas>"): "cuBLAS's headers, from the nvidia-cublas wheel whose library both link: the plugin "
    "puts them before the toolkit's own include folder (a full toolkit holds another cuBLAS's headers there), the "
    "native tools get them through CMAKE_CUDA_FLAGS, after it; this toolkit has no cuBLAS headers of its own",
}


def _missing(backend: str) -> str | None:
    """Why this backend cannot be configured here (None: it can)."""
    if backend == "vulkan" and not shutil.which("glslc"):
        return "no glslc (scripts/sysdeps.sh installs it)"
    if backend == "cuda":
        if not (shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()):
            return "no CUDA toolkit (nvcc)"
        try:
            importlib.metadata.distribution("nvidia-cublas")
        except importlib.metadata.PackageNotFoundError:
            return "nvidia-cublas is not installed (the CUDA plugin's build requirement: make cuda)"
    return None


def _commands(build: Path, tree: Path, source_dir: str) -> dict[str, list[str]]:
    """The backend's compile commands by source, paths made relative, output and input arguments dropped."""
    overlay = re.compile(r"/[^ ]*cuda-overlay/include")  # where each build links cuBLAS's headers
    out = {}
    for entry in json.loads((build / "compile_commands.json").read_text()):
        source = entry["file"].replace(str(build), "<build>").replace(str(tree), "<src>")
        if f"/ggml/src/{source_dir}/" not in source:
            continue
        args = entry.get("arguments") or shlex.split(entry["command"])
        kept, skip = [Path(args[0]).name], False
        for arg in args[1:]:
            if skip:
                skip = False
            elif arg in ("-o", "-c", "--output-file", "--compile"):
                skip = arg in ("-o", "--output-file")
            elif not arg.endswith("/" + Path(source).name):
                arg = overlay.sub("<cublas>", arg).replace(str(build), "<build>").replace(str(tree), "<src>")
                if kept[-1] == "-isystem":  # one flag with its folder, so that its place can be compared
                    kept[-1] += " " + arg
                else:
                    kept.append(arg)
        out[source] = kept
    return out


def _configure(source: Path, build: Path, args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja",
                           "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", *args], capture_output=True, text=True,
                          env=dict(os.environ, **env), timeout=600)
    assert done.returncode == 0, f"configuring {source} failed:\n{(done.stdout + done.stderr)[-4000:]}"


def differences(backend: str, tmp_path: Path, plugin_args: tuple[str, ...] = ()) -> list[str]:
    folder, source_dir, native_kwargs, env = BACKENDS[backend]
    tree = Path(native_tools.fetch.materialise())
    plugin = tmp_path / "plugin"
    cuda = [f"-DCMAKE_CUDA_ARCHITECTURES={CUDA_ARCHITECTURES}"] if backend == "cuda" else []
    _configure(REPO / "plugins" / folder, plugin, ["-DCMAKE_BUILD_TYPE=Release",
                                                   f"-DPython_EXECUTABLE={sys.executable}", *cuda, *plugin_args], env)
    native = tmp_path / "native"
    _configure(tree, native, native_tools.cmake_args(**native_kwargs, cuda_architectures=CUDA_ARCHITECTURES), {})
    ours, theirs = _commands(plugin, tree, source_dir), _commands(native, tree, source_dir)
    assert ours and theirs, f"no {source_dir} sources in compile_commands.json"
    found = [f"{s}: only in llama.cpp's build" for s in sorted(set(theirs) - set(ours))]
    found += [f"{s}: only in the plugin's build" for s in sorted(set(ours) - set(theirs))]
    for source in sorted(set(ours) & set(theirs)):
        mine = [a for a in ours[source] if (backend, a) not in ACCEPTED]
        reference = [a for a in theirs[source] if (backend, a) not in ACCEPTED]
        if mine == reference:
            continue
        only_ours = [a for a in mine if a not in reference]
        only_theirs = [a for a in reference if a not in mine]
        if only_ours or only_theirs:
            found.append(f"{source}: plugin only {only_ours}, llama.cpp only {only_theirs}")
        else:
            found.append(f"{source}: the same flags in another order:\n  {mine}\n  {reference}")
    return found


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_plugin_compiles_its_backend_as_llama_cpp_does(backend, tmp_path):
    missing = _missing(backend)
    if missing:
        pytest.skip(missing)
    found = differences(backend, tmp_path)
    assert not found, f"{len(found)} {backend} sources differ:\n" + "\n".join(found[:20])


def test_the_check_sees_cuda_graphs_turned_off(tmp_path):
    """The difference this test was written for, planted: a user's -DGGML_CUDA_GRAPHS=OFF (which the plugin honours)."""
    missing = _missing("cuda")
    if missing:
        pytest.skip(missing)
    found = differences("cuda", tmp_path, ("-DGGML_CUDA_GRAPHS=OFF",))
    assert found and all("llama.cpp only ['-DGGML_CUDA_USE_GRAPHS']" in f and "plugin only []" in f for f in found), \
        found[:5]
