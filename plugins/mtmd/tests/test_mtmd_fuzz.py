"""Corrupted PNG / BMP / JPEG / WAV / MP3 bytes through MtmdBitmap.from_bytes: a LlamaError or a bitmap, never a crash.

The cases run in a child interpreter (_mtmd_fuzz_run.py): a crash there fails this test with the
case that caused it, instead of killing pytest.
"""

from __future__ import annotations

import json
from pathlib import Path

from llamaplug_testing import REPO, run_isolated

CASES = 1500


def test_fuzz_bitmap_decoders(mtmd_files, llama_cpp_dir):
    jpeg = llama_cpp_dir / "tools" / "mtmd" / "test-1.jpeg"  # the pin's own sample (not committed here)
    script = Path(__file__).with_name("_mtmd_fuzz_run.py")
    args = [mtmd_files["text"], mtmd_files["mmproj"], mtmd_files["mmproj_audio"], jpeg, CASES, 20251123]
    # tests/ on the child's path: it builds its seed files with tests/fixtures/tiny_mmproj.py
    run = run_isolated(script, *map(str, args), path=str(REPO / "tests"), timeout=900)
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
