"""llamaplug's rocm backend: AMD GPUs through ROCm/HIP.

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

    register(module_backend(name="rocm", distribution="llamaplug-backend-rocm", priority=100, lib_dir=LIB, module="hip",
                            build_info=_build_info, check=lambda: isolated(__name__ + ".probe", "probe")))
