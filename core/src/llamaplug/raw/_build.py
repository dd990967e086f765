"""Build step (run by CMake): write the C source of the llamaplug.raw._cffi module."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cffi

sys.path.insert(0, str(Path(__file__).resolve().parent))
from declarations import C_HELPERS_SOURCE, ENTRY_HEADERS, cdef  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cc", required=True)
    parser.add_argument("--include", action="append", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    ffi = cffi.FFI()
    ffi.cdef(cdef(args.cc, args.include))
    ffi.set_source("llamaplug.raw._cffi", "".join(f'#include "{h}"\n' for h in ENTRY_HEADERS) + C_HELPERS_SOURCE)
    ffi.emit_c_code(args.out)


if __name__ == "__main__":
    main()
