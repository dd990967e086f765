#!/usr/bin/env python3
"""Build step (run by CMake): complete a CUDA toolkit assembled from NVIDIA's wheels.

A toolkit made of nvidia-* wheels (nvcc from nvidia-cuda-nvcc, cuBLAS from
nvidia-cublas) lacks two things the pinned ggml-cuda build links against:

- an unversioned libcublas.so / libcublasLt.so (the wheel holds only .so.13), and
  cuBLAS's headers somewhere the toolkit's include path reaches;
- libcuda.so, the driver library, at link time (only the VMM build needs it): the
  wheels carry no driver stub. We generate one from the toolkit's own cuda.h: every
  function it declares, exported by a library whose soname is libcuda.so.1, so the
  module records the driver's real name and the driver's own library is the one
  loaded at run time.

Writes <out>/overlay.cmake (and the same as overlay.json) with the cache settings that
point FindCUDAToolkit at them.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def toolkit_root() -> Path:
    for var in ("CUDAToolkit_ROOT", "CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    for candidate in (Path("/usr/local/cuda"), Path("/opt/cuda")):
        if (candidate / "include" / "cuda_runtime.h").exists():
            return candidate
    sys.exit("toolkit_overlay: no CUDA toolkit found (set CUDA_HOME to the folder holding bin/nvcc)")


def cublas_files(out: Path) -> tuple[Path, Path]:
    """The nvidia-cublas wheel's lib folder, and an include folder holding only its headers.

    Only cuBLAS's own: other nvidia-* wheels share that include folder, and a newer
    runtime's headers there would not match this nvcc.
    """
    try:
        dist = importlib.metadata.distribution("nvidia-cublas")
    except importlib.metadata.PackageNotFoundError:
        sys.exit("toolkit_overlay: nvidia-cublas is not installed in the build environment "
                 f"({sys.executable}); pip install 'nvidia-cublas>=13,<14'")
    lib = next((Path(dist.locate_file(f)).parent for f in dist.files or []
                if re.fullmatch(r"libcublas\.so\.\d+", Path(f).name)), None)
    if lib is None:
        sys.exit("toolkit_overlay: the nvidia-cublas wheel holds no libcublas.so.<N>")
    include = out / "include"
    shutil.rmtree(include, ignore_errors=True)
    include.mkdir(parents=True)
    for f in dist.files or []:
        if f.suffix == ".h" and "include" in f.parts:
            (include / f.name).symlink_to(Path(dist.locate_file(f)))
    if not (include / "cublas_v2.h").exists():
        sys.exit(f"toolkit_overlay: the nvidia-cublas wheel holds no cublas_v2.h ({dist.locate_file('')})")
    return lib, include


def link_unversioned(lib: Path, out: Path) -> dict[str, Path]:
    found = {}
    for name in ("cublas", "cublasLt"):
        real = next(iter(sorted(lib.glob(f"lib{name}.so.[0-9]*"))), None)
        if real is None:
            sys.exit(f"toolkit_overlay: no lib{name}.so.<N> in {lib}")
        link = out / "lib" / f"lib{name}.so"
        link.unlink(missing_ok=True)
        link.symlink_to(real)
        found[name] = link
    return found


def driver_stub(root: Path, out: Path, cc: str) -> Path:
    """libcuda.so for the linker: every function of cuda.h, soname libcuda.so.1."""
    existing = root / "lib64" / "stubs" / "libcuda.so"
    if existing.exists():
        return existing
    # The preprocessed header: cuda.h's #define cuX cuX_v2 renames are applied, so these
    # are the symbol names the module will import.
    text = subprocess.run([cc, "-E", "-P", "-x", "c", "-I", str(root / "include"), str(root / "include" / "cuda.h")],
                          check=True, capture_output=True, text=True).stdout
    names = sorted(set(re.findall(r"\b(cu[A-Z][A-Za-z0-9_]*)\s*\(", text)))
    if len(names) < 100:
        sys.exit(f"toolkit_overlay: found only {len(names)} functions in cuda.h; not a driver API header?")
    source = out / "libcuda_stub.c"
    source.write_text("".join(f"void {name}(void) {{}}\n" for name in names))
    stub = out / "lib" / "stubs" / "libcuda.so"
    stub.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(source)], check=True)
    return stub


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--cc", default=shutil.which("cc") or "cc")
    parser.add_argument("--driver-stub", action="store_true", help="also provide libcuda.so (VMM builds)")
    args = parser.parse_args()
    out: Path = args.out
    (out / "lib").mkdir(parents=True, exist_ok=True)
    root = toolkit_root()
    lib, include = cublas_files(out)
    libs = link_unversioned(lib, out)
    settings = {
        "CUDAToolkit_ROOT": root,
        "CMAKE_CUDA_COMPILER": root / "bin" / "nvcc",
        "CUDA_cublas_LIBRARY": libs["cublas"],
        "CUDA_cublasLt_LIBRARY": libs["cublasLt"],
        "LLAMAPLUG_CUBLAS_INCLUDE": include,
    }
    if args.driver_stub:
        settings["CUDA_cuda_driver_LIBRARY"] = driver_stub(root, out, args.cc)
    lines = [f'set({key} "{value}" CACHE FILEPATH "" FORCE)\n' for key, value in settings.items()]
    (out / "overlay.cmake").write_text("# Written by toolkit_overlay.py.\n" + "".join(lines))
    (out / "overlay.json").write_text(json.dumps({key: str(value) for key, value in settings.items()}))  # other builds
    print(out / "overlay.cmake")


if __name__ == "__main__":
    main()
