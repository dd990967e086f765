"""llamaplug's Vulkan backend: ggml-vulkan, for any GPU with a Vulkan 1.2 driver.

The probe runs in a child process (a broken driver may crash or hang its caller).
Mesa's lavapipe (a CPU-type device, used when GGML_VK_VISIBLE_DEVICES names it) is
slow, but a real Vulkan implementation: it is how the backend is tested without a GPU.
"""

from __future__ import annotations

from pathlib import Path

from llamaplug import hookimpl
from llamaplug.probes import isolated, module_backend

LIB = Path(__file__).resolve().parent / "lib"
PROBE_TIMEOUT = 30.0


@hookimpl
def llamaplug_register_backends(register):
    from . import _build_info  # written by the build

    register(module_backend(name="vulkan", distribution="llamaplug-backend-vulkan", priority=50, lib_dir=LIB,
                            build_info=_build_info,
                            check=lambda: isolated(__name__ + ".probe", "probe", PROBE_TIMEOUT)))
