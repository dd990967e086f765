"""The host-variant decision table (pure Python, fake /proc/cpuinfo) and the installed module."""

import pytest

import llamaplug_backend_cpu
from llamaplug_backend_cpu import variants


def cpuinfo(*flags):
    return "processor\t: 0\nflags\t\t: fpu " + " ".join(flags) + "\n"


@pytest.mark.parametrize("flags,expected", [
    ((), "x64"),
    (("sse4_2",), "sse42"),
    (("sse4_2", "avx", "f16c", "fma", "avx2", "bmi2"), "haswell"),
    (("sse4_2", "avx", "f16c", "fma", "avx2", "bmi2", "avx_vnni"), "alderlake"),
    (("sse4_2", "avx", "f16c", "fma", "avx2", "bmi2", "avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
     "skylakex"),
    (("sse4_2", "avx", "f16c", "fma", "avx2", "bmi2", "avx512f"), "haswell"),  # partial AVX-512 is not enough
])
def test_best_variant(flags, expected):
    assert variants.best_variant(variants.cpu_flags(cpuinfo(*flags))) == expected


def test_probe_picks_an_installed_module_that_runs_here():
    verdict = llamaplug_backend_cpu.probe.probe()
    assert verdict.ok, verdict.reason
    assert verdict.modules and verdict.modules[0].is_file()
    assert verdict.variant in variants.X86_VARIANTS
    assert verdict.variant in verdict.modules[0].name
