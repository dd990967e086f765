"""In CI a skip is a failure, unless it is one of the known hardware skips (GPU, CUDA).

A skip hides breakage when what is missing should be there: a native module that failed to build
(the mtmd tests import theirs outright for that reason), an extra that no longer imports (Ray), a model tox installs
(Gemma). Locally those skips say what to install; where `CI` is set (GitHub Actions sets CI=true; tox
passes it on), this plugin turns every skipped test, and every module skipped while being collected,
into a failure that keeps the skip's reason. Allowed to skip: tests marked `gpu` or `cuda`, and the
GPU backend plugins' own tests (they need hardware and builds CI does not have).

Loaded for every test folder by the root conftest.py (`pytest_plugins`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HARDWARE_MARKERS = frozenset({"gpu", "cuda"})
HARDWARE_FOLDERS = ("backend_cuda", "backend_rocm", "backend_metal")  # plugins/<name>/tests


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def allowed(path: Path, markers: set[str]) -> bool:
    """Whether a test at `path` with `markers` may skip in CI."""
    return bool(markers & HARDWARE_MARKERS) or any(part in HARDWARE_FOLDERS for part in path.parts)


def _fail(report: pytest.TestReport | pytest.CollectReport) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped in CI (CI={os.environ.get('CI')}), where only GPU/CUDA tests may skip: {reason}\n"
                       "Install or build what it names (tox -e py does), or mark the test gpu/cuda if it needs "
                       "hardware.")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and not hasattr(report, "wasxfail") and in_ci()
            and not allowed(item.path, {m.name for m in item.iter_markers()})):
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and not allowed(collector.path, {m.name for m in collector.iter_markers()}):
        _fail(report)
