"""Can ROCm/HIP run here? Facts from the HIP runtime in a child process; `decide` judges them (pure, tested)."""

from __future__ import annotations

import ctypes

# gfx targets compiled in (keep in step with CMakeLists.txt).
COMPILED_TARGETS = ("gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101", "gfx1200", "gfx1201")


def gather() -> dict:
    """{"runtime": bool, "devices": [[name, gfx], ...], "error": str}."""
    try:
        hip = ctypes.CDLL("libamdhip64.so")
    except OSError as exc:
        return {"runtime": False, "devices": [], "error": f"libamdhip64.so not found ({exc})"}
    count = ctypes.c_int()
    if hip.hipGetDeviceCount(ctypes.byref(count)) != 0:
        return {"runtime": True, "devices": [], "error": "hipGetDeviceCount failed"}
    devices = []
    for i in range(count.value):
        name = ctypes.create_string_buffer(256)
        hip.hipDeviceGetName(name, 256, i)
        # gcnArchName ("gfx90a:sramecc+:xnack-") without the feature suffixes.
        arch = ctypes.create_string_buffer(256)
        get_arch = getattr(hip, "hipDeviceGetAttributeString", None)
        gfx = ""
        if get_arch is not None and get_arch(arch, 256, 0, i) == 0:
            gfx = arch.value.decode().split(":")[0]
        devices.append([name.value.decode(errors="replace"), gfx])
    return {"runtime": True, "devices": devices, "error": ""}


def decide(facts: dict) -> dict:
    if not facts["runtime"]:
        return {"ok": False, "reason": f"no ROCm/HIP runtime: {facts['error']}"}
    if not facts["devices"]:
        return {"ok": False, "reason": "the HIP runtime sees no AMD GPU"}
    usable = [f"{n} ({g})" for n, g in facts["devices"] if g in COMPILED_TARGETS]
    if not usable:
        seen = ", ".join(f"{n} {g or 'unknown gfx'}" for n, g in facts["devices"])
        targets = ", ".join(COMPILED_TARGETS)
        return {"ok": False, "reason": f"no GPU this build runs on ({seen}); compiled for {targets}"}
    return {"ok": True, "reason": f"{len(usable)} HIP device(s)", "devices": usable}


def probe() -> dict:
    return decide(gather())
