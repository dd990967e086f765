"""The Metal probe's decision table, with fake platforms."""

import pytest
from llamaplug_backend_metal import probe


@pytest.mark.parametrize("facts,ok,words", [
    ({"system": "Linux", "machine": "x86_64", "macos": ""}, False, ["needs macOS", "Linux"]),
    ({"system": "Darwin", "machine": "x86_64", "macos": "14.5"}, False, ["Apple silicon", "x86_64"]),
    ({"system": "Darwin", "machine": "arm64", "macos": "12.6"}, False, ["12.6", "older"]),
    ({"system": "Darwin", "machine": "arm64", "macos": "15.1"}, True, ["Apple silicon", "15.1"]),
])
def test_decide(facts, ok, words):
    verdict = probe.decide(facts)
    assert verdict["ok"] is ok
    assert all(w in verdict["reason"] for w in words), verdict["reason"]


def test_this_machine():
    import platform

    apple_silicon = platform.system() == "Darwin" and platform.machine() == "arm64"
    assert probe.probe()["ok"] is apple_silicon
