"""The CUDA probe's decision table, with fake driver facts (runs without a GPU)."""

import pytest
from llamaplug_backend_cuda import probe

H100 = ["NVIDIA H100 80GB HBM3", 9, 0]


@pytest.mark.parametrize("facts,ok,words", [
    ({"driver": None, "devices": [], "error": "libcuda.so.1 not found"}, False, ["no NVIDIA driver", "libcuda"]),
    ({"driver": 12040, "devices": [H100], "error": ""}, False, ["CUDA 12.4", "needs 13.0", "update"]),
    ({"driver": 13000, "devices": [], "error": ""}, False, ["no CUDA device"]),
    ({"driver": 13000, "devices": [["Tesla T4", 7, 5]], "error": ""}, False, ["sm_75", "sm_80, sm_90"]),
    ({"driver": 13000, "devices": [H100], "error": ""}, True, ["1 CUDA device"]),
    ({"driver": 13020, "devices": [["NVIDIA A10", 8, 6], ["RTX 5090", 12, 0]], "error": ""}, True, ["2 CUDA"]),
])
def test_decide(facts, ok, words):
    verdict = probe.decide(facts)
    assert verdict["ok"] is ok
    assert all(w in verdict["reason"] for w in words), verdict["reason"]


def test_runs_on_uses_sass_minor_and_ptx():
    assert probe.runs_on(8, 0) and probe.runs_on(8, 9) and probe.runs_on(9, 0) and probe.runs_on(10, 0)
    assert not probe.runs_on(7, 5) and not probe.runs_on(6, 1)


def test_real_gather_without_a_driver_is_a_verdict():
    facts = probe.gather()
    verdict = probe.decide(facts)
    if facts["driver"] is None:  # this machine: no NVIDIA driver
        assert not verdict["ok"] and "no NVIDIA driver" in verdict["reason"]
    else:
        assert verdict["ok"] == bool(verdict.get("devices"))
