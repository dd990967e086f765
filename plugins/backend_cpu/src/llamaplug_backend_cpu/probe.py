"""Which CPU variant runs best here: ggml's own score of each installed module (in process: no driver)."""

from __future__ import annotations

import sys
from pathlib import Path

from llamaplug.probes import ProbeResult, module_score

LIB = Path(__file__).resolve().parent / "lib"
_SUFFIX = {"darwin": ".so", "win32": ".dll"}.get(sys.platform, ".so")


def modules() -> list[Path]:
    return sorted(LIB.glob(f"*ggml-cpu-*{_SUFFIX}"))


def probe() -> ProbeResult:
    """Pick the best installed variant by ggml's own score for this CPU."""
    found = modules()
    if not found:
        return ProbeResult(False, f"no CPU backend module in {LIB}: reinstall llamaplug-backend-cpu")
    scored = sorted(((module_score(path), path) for path in found), reverse=True)
    score, best = scored[0]
    if score <= 0:
        names = ", ".join(p.name for p in found)
        return ProbeResult(False, f"none of the installed CPU variants ({names}) runs on this CPU")
    variant = best.name.split("ggml-cpu-", 1)[1].removesuffix(_SUFFIX)
    return ProbeResult(True, f"variant {variant} ({len(found)} installed)", devices=("CPU",),
                       variant=variant, modules=(best,))
