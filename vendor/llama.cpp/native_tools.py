#!/usr/bin/env python3
"""Build llama.cpp's own tools from the pinned tree: the reference for tests and benchmarks.

The tools are built with the same CPU variant flags as llamaplug-backend-cpu's
host build, so their numerics are the ones llamaplug runs. Cached per pin and
variant; prints the bin/ directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent / "plugins" / "backend_cpu" / "src" / "llamaplug_backend_cpu"))

import fetch  # noqa: E402
import variants  # noqa: E402

TOOLS = ("llama-completion", "llama-bench", "llama-batched-bench", "llama-tokenize", "llama-embedding", "llama-server",
         "llama-mtmd-cli", "llama-quantize", "llama-speculative-simple", "llama-lookup")


def gpu_flags(backend: str, cuda_architectures: str = "native") -> list[str]:
    """CMake flags for the tools' GPU (or RPC) backend; CUDA for the GPUs of this machine unless told which."""
    if backend == "cpu":
        return []
    if backend in ("vulkan", "rpc"):
        return [f"-DGGML_{backend.upper()}=ON"]
    if backend == "cuda":
        # The same toolkit completion as the CUDA plugin's build (cuBLAS from its wheel, driver stub).
        overlay = fetch.cache_root() / "native-cuda-overlay"
        subprocess.run([sys.executable, str(HERE.parent.parent / "plugins" / "backend_cuda" / "toolkit_overlay.py"),
                        "--out", str(overlay), "--driver-stub"], check=True, stdout=subprocess.DEVNULL)
        settings = json.loads((overlay / "overlay.json").read_text())
        include = f"-isystem {settings.pop('LLAMAPLUG_CUBLAS_INCLUDE')}"
        return ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_architectures}", f"-DCMAKE_CXX_FLAGS={include}",
                f"-DCMAKE_CUDA_FLAGS={include}", *[f"-D{k}={v}" for k, v in settings.items()]]
    raise SystemExit(f"native_tools: no recipe for backend {backend!r}")


def cmake_args(backend: str = "cpu", cuda_architectures: str = "native", cpu_variants: str = "host") -> list[str]:
    """llama.cpp's own CMake settings for the tools: shared libraries and backend modules as llamaplug's, the
    CPU variant of llamaplug-backend-cpu's host build (or every variant, as its release wheel), `backend` on.
    tests/test_build_parity.py configures the plugins against exactly these."""
    if cpu_variants == "all":
        cpu = ["-DGGML_CPU_ALL_VARIANTS=ON"]
    else:
        features = set(variants.X86_VARIANTS[variants.best_variant(variants.cpu_flags())])
        cpu = ["-DGGML_CPU_ALL_VARIANTS=OFF", *[f"-DGGML_{f}={'ON' if f in features else 'OFF'}"
                                                for f in variants.CPU_FLAGS]]
    return [
        "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_BACKEND_DL=ON", "-DGGML_NATIVE=OFF", *cpu,
        *gpu_flags(backend, cuda_architectures), "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=ON",
        # The server for its /apply-template, /infill and /v1/rerank (the references of chat and rerank);
        # without its web UI, which would be fetched or built with npm.
        "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF",
    ]


def build(targets: tuple[str, ...] = TOOLS, backend: str = "cpu", cuda_architectures: str = "native") -> Path:
    # Tools built on another machine (the GPU kit, scripts/gpu_session.sh): used as they are, never rebuilt.
    prebuilt = os.environ.get("LLAMAPLUG_NATIVE_TOOLS")
    if prebuilt:
        missing = [t for t in targets if not (Path(prebuilt) / t).exists()]
        if missing:
            raise SystemExit(f"native_tools: LLAMAPLUG_NATIVE_TOOLS={prebuilt} lacks {', '.join(missing)}")
        return Path(prebuilt)
    # Two test processes asking at once (a suite run beside a single test) would run two ninjas in one build
    # folder, which corrupts it: the second waits for the first and then finds the tools built.
    fetch.cache_root().mkdir(parents=True, exist_ok=True)
    with open(fetch.cache_root() / "native-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(targets, backend, cuda_architectures)


def _build_locked(targets: tuple[str, ...], backend: str, cuda_architectures: str) -> Path:
    tree = fetch.materialise()
    name = variants.best_variant(variants.cpu_flags())
    suffix = "" if backend == "cpu" else f"-{backend}"
    if backend == "cuda" and cuda_architectures != "native":
        suffix += f"-{cuda_architectures}"
    build_dir = fetch.cache_root() / f"native-{fetch.tree_dir(fetch.read_pin()).name}-{name}{suffix}"
    bin_dir = build_dir / "bin"
    if all((bin_dir / t).exists() for t in targets):
        return bin_dir
    launcher = []
    if shutil.which("ccache"):
        launcher = ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(tree), "-B", str(build_dir), *generator,
                    *cmake_args(backend, cuda_architectures), *launcher], check=True, stdout=subprocess.DEVNULL)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(build_dir), "--target", *targets, "-j", jobs], check=True)
    return bin_dir


def _reference(name: str, source_name: str) -> Path:
    """A small reference program of ours (reference/SOURCE) linked to the tools' libllama-common and libllama."""
    bin_dir = build()
    tool = bin_dir / name
    source = HERE / "reference" / source_name
    if tool.exists() and tool.stat().st_mtime >= source.stat().st_mtime:
        return tool
    tree = fetch.materialise()
    includes = [f"-I{tree / d}" for d in ("common", "include", "ggml/include", "vendor")]
    subprocess.run([os.environ.get("CXX", "g++"), "-std=c++17", "-O1", *includes, str(source), f"-L{bin_dir}",
                    "-lllama-common", "-lllama", f"-Wl,-rpath,{bin_dir}", "-o", str(tool)], check=True)
    return tool


def json_schema_reference() -> Path:
    """llama.cpp's own JSON-schema-to-GBNF converter (common/ of the pin) as a command: schema on stdin,
    GBNF on stdout. Our 15-line main (reference/json_schema_to_gbnf.cpp)."""
    return _reference("llamaplug-json-schema-to-gbnf", "json_schema_to_gbnf.cpp")


def chat_reference() -> Path:
    """llama.cpp's own chat layer (common/chat.h of the pin) on one template: prompt, the template's own
    tool-call reply, parsed whole and streamed (reference/chat_reference.cpp)."""
    return _reference("llamaplug-chat-reference", "chat_reference.cpp")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "vulkan", "rpc"])
    ap.add_argument("--cuda-architectures", default="native",
                    help="CMAKE_CUDA_ARCHITECTURES (native: this machine's GPU; 90-real for the GPU kit)")
    ap.add_argument("--targets", nargs="+", default=list(TOOLS), metavar="TOOL")
    args = ap.parse_args()
    print(build(tuple(args.targets), backend=args.backend, cuda_architectures=args.cuda_architectures))
