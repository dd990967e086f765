"""llamaplug's cuda backend: NVIDIA GPUs through CUDA.

The probe runs in a child process (a driver may crash or hang its caller).
"""

from __future__ import annotations

from pathlib import Path

from llamaplug import hookimpl
from llamaplug.probes import isolated, module_backend

LIB = Path(__file__).resolve().parent / "lib"


@hookimpl
def llamaplug_register_backends(register):
    from . import _build_info  # written by the build

    register(module_backend(name="cuda", distribution="llamaplug-backend-cuda", priority=100, lib_dir=LIB,
                            build_info=_build_info, check=lambda: _check(_build_info)))


def _check(build_info) -> dict:
    # The variant (vmm / no-vmm) and the compiled architectures show in `llamaplug info`.
    variant = f"{getattr(build_info, 'CUDA_VARIANT', '?')}, {getattr(build_info, 'CUDA_ARCHITECTURES', '?')}"
    return {**isolated(__name__ + ".probe", "probe"), "variant": variant}
