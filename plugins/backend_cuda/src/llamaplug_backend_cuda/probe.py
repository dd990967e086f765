"""Can CUDA run here? Facts come from the driver API (libcuda) in a child process; `decide` judges them.

`decide` is pure, so its table is tested with fake facts on machines without a GPU.
"""

from __future__ import annotations

import ctypes

# What this build supports (keep in step with CMakeLists.txt and the nvidia-* pins in pyproject.toml).
RUNTIME_VERSION = 13000  # CUDA 13.0, as cudaRuntimeGetVersion reports it
COMPILED_ARCHS = (80, 90)  # SASS for sm_80 and sm_90
PTX_ARCH = 90  # PTX of sm_90 JIT-compiles for newer GPUs


def gather() -> dict:
    """Driver facts: {"driver": version or None, "devices": [[name, major, minor], ...], "error": str}."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return {"driver": None, "devices": [], "error": f"libcuda.so.1 not found ({exc})"}
    if cuda.cuInit(0) != 0:
        return {"driver": None, "devices": [], "error": "cuInit failed (driver installed but not usable)"}
    version, count = ctypes.c_int(), ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(version))
    cuda.cuDeviceGetCount(ctypes.byref(count))
    devices = []
    for i in range(count.value):
        dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(dev), i)
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGetName(name, 256, dev)
        cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # COMPUTE_CAPABILITY_MAJOR
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # COMPUTE_CAPABILITY_MINOR
        devices.append([name.value.decode(errors="replace"), major.value, minor.value])
    return {"driver": version.value, "devices": devices, "error": ""}


def runs_on(major: int, minor: int) -> bool:
    cc = major * 10 + minor
    # SASS runs on the same major with an equal or higher minor; PTX on anything newer.
    return any(cc // 10 == arch // 10 and cc >= arch for arch in COMPILED_ARCHS) or cc >= PTX_ARCH


def decide(facts: dict) -> dict:
    if facts["driver"] is None:
        return {"ok": False, "reason": f"no NVIDIA driver: {facts['error']}"}
    if facts["driver"] < RUNTIME_VERSION:
        have, need = facts["driver"], RUNTIME_VERSION
        return {"ok": False, "reason": f"the driver supports CUDA {have // 1000}.{have % 1000 // 10}, this build "
                                       f"needs {need // 1000}.{need % 1000 // 10}: update the NVIDIA driver"}
    if not facts["devices"]:
        return {"ok": False, "reason": "the NVIDIA driver sees no CUDA device"}
    usable = [f"{n} (sm_{a}{b})" for n, a, b in facts["devices"] if runs_on(a, b)]
    if not usable:
        seen = ", ".join(f"{n} sm_{a}{b}" for n, a, b in facts["devices"])
        archs = ", ".join(f"sm_{a}" for a in COMPILED_ARCHS)
        return {"ok": False, "reason": f"no device this build runs on ({seen}); compiled for {archs}"}
    return {"ok": True, "reason": f"{len(usable)} CUDA device(s)", "devices": usable}


def probe() -> dict:
    return decide(gather())
