"""Build step (run by CMake): write the C source of the llamaplug_mtmd._cffi module.

The declarations are mtmd.h and mtmd-helper.h themselves, run through the C preprocessor
exactly as the core derives llama.h's (its `declarations.py`, from the installed core), with
llama.h and ggml.h stubbed out: their types come from the core's module by `ffi.include`, so a
`llama_context *` of the core is a `llama_context *` here, and nothing is retyped by hand.
The module is compiled in cffi's API mode against the real headers, so drift fails the build.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import tempfile
from pathlib import Path

import cffi

ENTRY_HEADERS = ("mtmd.h", "mtmd-helper.h")
# The core's headers (their declarations come from the core's module) and libc's (cffi knows those types).
STUB_HEADERS = ("stddef.h", "stdint.h", "stdio.h", "stdbool.h", "stdarg.h", "ggml.h", "llama.h", "ggml-backend.h",
                "ggml-cpu.h", "ggml-opt.h", "gguf.h")
# llama.h's spelling of a deprecated declaration, without the attribute.
STUB_LLAMA_H = "#define DEPRECATED(func, hint) func\n"


def core_declarations(core_dir: Path):
    """The installed core's raw/declarations.py, loaded by path (importing llamaplug would load its libraries)."""
    spec = importlib.util.spec_from_file_location("_llamaplug_core_declarations", core_dir / "raw" / "declarations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def preprocess(cc: str, include_dirs: list[str]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        stubs = Path(tmp)
        for name in STUB_HEADERS:
            (stubs / name).write_text(STUB_LLAMA_H if name == "llama.h" else "")
        entry = stubs / "entry.h"
        entry.write_text("".join(f'#include "{h}"\n' for h in ENTRY_HEADERS))
        cmd = [cc, "-E", "-P", "-nostdinc", "-U__GNUC__", "-U__clang__", f"-I{stubs}"]
        cmd += [f"-I{d}" for d in include_dirs] + [str(entry)]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def cdef(cc: str, include_dirs: list[str], core) -> str:
    text = core.clean(preprocess(cc, include_dirs))
    # typedefs of the core's types that mtmd.h repeats would be duplicates of the included module's
    text = re.sub(r"^typedef struct (llama_\w+|ggml_\w+)\s*\*?\s*\w+;\s*$", "", text, flags=re.M)
    return text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cc", required=True)
    parser.add_argument("--core", required=True, help="the installed llamaplug package's folder")
    parser.add_argument("--include", action="append", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    core = core_declarations(Path(args.core))
    core_ffi = cffi.FFI()
    core_ffi.cdef(core.cdef(args.cc, args.include))
    core_ffi.set_source("llamaplug.raw._cffi", "")  # C-based, as the core builds it
    ffi = cffi.FFI()
    ffi.include(core_ffi)
    ffi.cdef(cdef(args.cc, args.include, core))
    ffi.set_source("llamaplug_mtmd._cffi", "".join(f'#include "{h}"\n' for h in ENTRY_HEADERS))
    ffi.emit_c_code(args.out)


if __name__ == "__main__":
    main()
