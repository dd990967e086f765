"""ggml's x86 CPU variants (ggml/src/CMakeLists.txt) and the one this machine runs best.

Run as a script at build time: prints "<variant> <ggml features...>" for the
host. Also used at run time to name the variant that was chosen.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

# Variant -> ggml features, in ggml's order (later is better where supported).
X86_VARIANTS: dict[str, tuple[str, ...]] = {
    "x64": (),
    "sse42": ("SSE42",),
    "sandybridge": ("SSE42", "AVX"),
    "ivybridge": ("SSE42", "AVX", "F16C"),
    "piledriver": ("SSE42", "AVX", "F16C", "FMA"),
    "haswell": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2"),
    "alderlake": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX_VNNI"),
    "skylakex": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512"),
    "cannonlake": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI"),
    "cascadelake": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VNNI"),
    "icelake": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI"),
    "cooperlake": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VNNI", "AVX512_BF16"),
    "zen4": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"),
    "sapphirerapids": (
        "SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI",
        "AVX512_BF16", "AMX_TILE", "AMX_INT8",
    ),
}

# ggml feature -> /proc/cpuinfo flags it needs.
CPU_FLAGS = {
    "SSE42": ("sse4_2",),
    "AVX": ("avx",),
    "F16C": ("f16c",),
    "FMA": ("fma",),
    "AVX2": ("avx2",),
    "BMI2": ("bmi2",),
    "AVX_VNNI": ("avx_vnni",),
    "AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "AVX512_VBMI": ("avx512vbmi",),
    "AVX512_VNNI": ("avx512_vnni",),
    "AVX512_BF16": ("avx512_bf16",),
    "AMX_TILE": ("amx_tile",),
    "AMX_INT8": ("amx_int8",),
}


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def best_variant(flags: set[str]) -> str:
    """The variant with the most features that all run on a CPU with `flags`."""
    usable = [
        name for name, feats in X86_VARIANTS.items()
        if all(flag in flags for feat in feats for flag in CPU_FLAGS[feat])
    ]
    return max(usable, key=lambda name: len(X86_VARIANTS[name]))


def main() -> int:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        print("llamaplug: only x86-64 has a host-variant table; build with LLAMAPLUG_CPU_VARIANTS=all",
              file=sys.stderr)
        return 1
    name = best_variant(cpu_flags())
    print(" ".join((name, *X86_VARIANTS[name])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
