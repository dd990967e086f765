"""llamaplug's RPC backend: devices of other machines (or processes), reached over TCP.

There is no authentication in ggml's RPC protocol: a server runs whatever
graph a client sends and reads/writes its buffers. Bind servers to loopback
(the default) or to a network you trust.
"""

from __future__ import annotations

from pathlib import Path

from llamaplug import hookimpl
from llamaplug.probes import module_backend

from . import probe

LIB = Path(__file__).resolve().parent / "lib"


@hookimpl
def llamaplug_register_backends(register):
    from . import _build_info  # written by the build

    # In process: nothing here touches a driver.
    register(module_backend(name="rpc", distribution="llamaplug-backend-rpc", priority=10, lib_dir=LIB,
                            build_info=_build_info, check=probe.probe))
