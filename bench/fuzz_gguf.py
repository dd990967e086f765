#!/usr/bin/env python3
"""The long GGUF fuzz run: load thousands of corrupted GGUF files, count what happened.

    .venv/bin/python bench/fuzz_gguf.py --cases 10000 --seed 1

Cases come from tests/fixtures/gguf_fuzz.py (deterministic per --seed: case i
of seed s is always the same file), derived from the tiny generated model and
from the header of the real SmolLM2 GGUF. Each is loaded in a worker child
(RLIMIT_AS 4 GiB, a deadline per case); a loaded model then decodes one token
and samples it. Prints the counts -- loaded cleanly, LlamaError by class and
stage, wrong exception types, crashes, timeouts -- and the wall time, then every
case that was not "loaded" or "LlamaError" with the child's stderr. Exit status 1
if there was any. Other options: --tokenize (also tokenize/detokenize each loaded
model), --no-smollm2, --only I J K (re-run single cases), --dump DIR (write the
files of failing cases), --json FILE (every result).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fixtures import gguf_fuzz  # noqa: E402


def main() -> int:
    argv = sys.argv[1:]
    if "--cases" not in argv and "--only" not in argv:
        argv = ["--cases", "10000", *argv]
    t0 = time.perf_counter()
    rc = gguf_fuzz.main(argv)
    print(f"wall time: {time.perf_counter() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
