"""llamaplug_testing.ci_skips: in CI, a skip other than a GPU/CUDA one fails the suite (issue 36 B2).

Each case is a pytest run of its own, in a subprocess, over a folder of planted tests: a module whose
native import is missing (as a broken llamaplug_mtmd._cffi), a test skipped at run time (as Ray failing
to import, or Gemma not installed), and the hardware skips that stay allowed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLANTED = {
    "test_native.py": """
        import pytest
        try:  # a native module that was not built, as a broken llamaplug_mtmd._cffi
            import llamaplug_planted_missing._cffi  # noqa: F401
        except ImportError:
            pytest.skip("llamaplug_planted_missing._cffi is not built here", allow_module_level=True)

        def test_uses_it():
            pass
    """,
    "test_runtime.py": """
        import pytest

        @pytest.fixture
        def model():
            pytest.skip("the model is not installed")

        def test_needs_a_model(model):
            pass

        def test_runs():
            pass

        @pytest.mark.gpu
        def test_on_a_gpu():
            pytest.skip("no GPU here")

        @pytest.mark.xfail(reason="known")
        def test_known_failure():
            assert False
    """,
}


def run_planted(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    for name, text in PLANTED.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["llamaplug_testing.ci_skips"]\n\n\n'
                                          'def pytest_configure(config):\n'
                                          '    config.addinivalue_line("markers", "gpu: needs a GPU")\n')
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the planted folder's conftest loads the one plugin it tests
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                           "--continue-on-collection-errors", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_outside_ci_a_skip_is_a_skip(tmp_path):
    done = run_planted(tmp_path, None)
    assert done.returncode == 0, done.stdout
    assert "1 passed, 3 skipped, 1 xfailed" in done.stdout


@pytest.mark.parametrize("ci", ["true", "1"])
def test_in_ci_only_the_gpu_skip_stays_a_skip(tmp_path, ci):
    done = run_planted(tmp_path, ci)
    assert done.returncode == 1, done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("1 passed, 1 skipped, 1 xfailed, 2 errors"), done.stdout
    assert "ERROR test_runtime.py::test_needs_a_model" in done.stdout
    assert "ERROR test_native.py" in done.stdout
    assert "SKIPPED [1] test_runtime.py" in done.stdout and "no GPU here" in done.stdout
    assert "the model is not installed" in done.stdout and "not built here" in done.stdout  # reasons kept
