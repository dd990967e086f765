"""Can Metal run here? Apple silicon macOS only; `decide` is pure and tested with fake platforms."""

from __future__ import annotations

import platform

MIN_MACOS = (13, 3)


def gather() -> dict:
    return {"system": platform.system(), "machine": platform.machine(), "macos": platform.mac_ver()[0]}


def decide(facts: dict) -> dict:
    if facts["system"] != "Darwin":
        return {"ok": False, "reason": f"Metal needs macOS; this is {facts['system']}"}
    if facts["machine"] != "arm64":
        return {"ok": False, "reason": f"Metal backend builds target Apple silicon; this Mac is {facts['machine']}"}
    version = tuple(int(p) for p in (facts["macos"] or "0").split(".")[:2])
    if version < MIN_MACOS:
        return {"ok": False, "reason": f"macOS {facts['macos']} is older than {'.'.join(map(str, MIN_MACOS))}"}
    return {"ok": True, "reason": f"Apple silicon, macOS {facts['macos']}", "devices": ["Apple GPU (Metal)"]}


def probe() -> dict:
    return decide(gather())
