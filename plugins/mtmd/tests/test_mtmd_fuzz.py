"""Corrupted PNG / BMP / JPEG / WAV / MP3 bytes through MtmdBitmap.from_bytes: a LlamaError or a bitmap, never a crash.

The cases run in a child interpreter (_mtmd_fuzz_run.py): a crash there fails this test with the
case that caused it, instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support import REPO

CASES = 1500


def test_fuzz_bitmap_decoders(mtmd_files):
    sys.path.insert(0, str(REPO / "vendor" / "llama.cpp"))
    import fetch

    jpeg = fetch.materialise() / "tools" / "mtmd" / "test-1.jpeg"  # the pin's own sample (not committed here)
    script = Path(__file__).with_name("_mtmd_fuzz_run.py")
    args = [mtmd_files["text"], mtmd_files["mmproj"], mtmd_files["mmproj_audio"], jpeg, CASES, 20251123]
    run = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    last = run.stdout.strip().splitlines()[-1:] or ["(no output)"]
    assert run.returncode == 0, f"the child died (rc {run.returncode}) at: {last[0]}\n{run.stderr[-3000:]}"
    summary = json.loads(last[0])
    assert summary["cases"] == CASES >= 1000
    assert summary["unexpected"] == []
    outcomes = summary["outcomes"]
    assert sum(outcomes.values()) == CASES
    # both ways out were exercised: corrupt inputs refused, mildly damaged ones decoded and preprocessed
    assert sum(v for k, v in outcomes.items() if "MediaDecodeError" in k) > 100
    assert sum(v for k, v in outcomes.items() if k.endswith("decoded+tokenized")) > 100
    assert outcomes.get("wav: MediaDecodeError", 0) > 10 and outcomes.get("wav: decoded+tokenized", 0) > 10
