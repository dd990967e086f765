"""The ROCm probe's decision table, with fake HIP facts."""

import pytest
from llamaplug_backend_rocm import probe


@pytest.mark.parametrize("facts,ok,words", [
    ({"runtime": False, "devices": [], "error": "libamdhip64.so not found"}, False, ["no ROCm/HIP runtime"]),
    ({"runtime": True, "devices": [], "error": ""}, False, ["no AMD GPU"]),
    ({"runtime": True, "devices": [["Radeon RX 580", "gfx803"]], "error": ""}, False, ["gfx803", "gfx1100"]),
    ({"runtime": True, "devices": [["Instinct MI300X", "gfx942"]], "error": ""}, True, ["1 HIP device"]),
])
def test_decide(facts, ok, words):
    verdict = probe.decide(facts)
    assert verdict["ok"] is ok
    assert all(w in verdict["reason"] for w in words), verdict["reason"]
