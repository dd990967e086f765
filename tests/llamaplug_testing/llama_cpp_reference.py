"""llama-cpp-python 0.3.36 itself, the reference of the compat layer's tests (tests/test_compat_*.py).

tox.ini's commands_pre installs it without its own llama.cpp build (LLAMA_BUILD=OFF); it runs on the pin's
libllama from the native tools (the same llama.cpp commit its sdist ships; our patches do not touch libllama,
and the one to ggml's backend search only acts where the core defines GGML_BACKEND_NO_DEFAULT_SEARCH). Both are
`llama_cpp` to the code that imports it, so each side runs a script in a child process of its own:
`script reference MODEL ...` on llama-cpp-python, `script compat MODEL ...` on llamaplug.compat after
install_as_llama_cpp(), the two at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REFERENCE = "0.3.36"


def run_both(script: Path, model: Path, native_tools: Path, *args: str, timeout: float = 1800) -> dict[str, str]:
    """Each side's standard output of `script SIDE MODEL ARGS...`, both children run at once."""
    assert metadata.version("llama_cpp_python") == REFERENCE, "llama-cpp-python 0.3.36 is the reference (tox.ini)"
    # GGML_BACKEND_PATH: libggml looks for its CPU module beside the executable (python's bin/), so it is named.
    reference_env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(native_tools),
                         GGML_BACKEND_PATH=str(native_tools / "libggml-cpu.so"))
    children = {side: subprocess.Popen([sys.executable, str(script), side, str(model), *args], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for side, env in (("reference", reference_env), ("compat", None))}
    out = {}
    try:
        for side, child in children.items():
            stdout, stderr = child.communicate(timeout=timeout)
            assert child.returncode == 0, f"{side}: {stderr[-3000:]}"
            out[side] = stdout
    finally:  # a side that failed or ran out of time leaves no child behind
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
    return out
