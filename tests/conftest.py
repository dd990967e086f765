"""Shared fixtures: the pinned tree, the real test model, the native reference tools."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "vendor" / "llama.cpp"))

THREADS = 2


@pytest.fixture(scope="session")
def llama_cpp_dir() -> Path:
    import fetch

    return fetch.materialise()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from llamaplug.catalog import default_model

    return default_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def native_tools(llama_cpp_dir) -> Path:
    """bin/ of llama-completion etc., built from the same pin (cached; built once if missing)."""
    import native_tools

    return native_tools.build()


@pytest.fixture(scope="module")
def llama(smollm2_path):
    import llamaplug as lp

    with lp.Llama.load(lp.LlamaParams(model_path=smollm2_path, n_ctx=2048, n_threads=THREADS)) as instance:
        yield instance


def run_isolated(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter, so a crash fails the test instead of killing pytest."""
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
