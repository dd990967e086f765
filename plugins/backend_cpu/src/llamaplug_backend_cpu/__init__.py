"""llamaplug's CPU backend: ggml's CPU module(s), built from the pinned llama.cpp.

The probe runs in process: it only asks each installed variant for ggml's score.
"""

from __future__ import annotations

from pathlib import Path

from llamaplug import hookimpl
from llamaplug.probes import BackendSpec

from . import probe

LIB = Path(__file__).resolve().parent / "lib"


@hookimpl
def llamaplug_register_backends(register):
    from . import _build_info  # written by the build

    register(BackendSpec(name="cpu", distribution="llamaplug-backend-cpu", priority=0, probe=probe.probe,
                         llama_cpp_commit=_build_info.LLAMA_CPP_COMMIT, ggml_version=_build_info.GGML_VERSION))
