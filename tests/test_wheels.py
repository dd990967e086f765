"""The wheels a user installs: honest tags, and core + CPU from a folder into a fresh venv that generates text.

`make wheels` builds every CPU variant for release; here the CPU plugin is built for this
machine only (LLAMAPLUG_CPU_VARIANTS=host, as the rest of the suite), into the same
build folders the suite's install used, so only the packaging is new work.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from llamaplug_testing import REPO, THREADS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, LLAMAPLUG_CPU_VARIANTS="host")
    # With their dependencies: the install below reads this folder only.
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "-w", str(out),
                           str(REPO / "core"), str(REPO / "plugins" / "backend_cpu")],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_wheel_tags_say_what_the_wheels_hold(dist):
    names = {p.name.split("-")[0]: p.name for p in dist.glob("llamaplug*.whl")}
    # The core's cffi module uses only the stable ABI (cffi's generated C defines Py_LIMITED_API).
    assert names["llamaplug"].endswith("-cp310-abi3-linux_x86_64.whl"), names
    # The plugin holds ggml modules loaded by path and no Python extension at all.
    assert names["llamaplug_backend_cpu"].endswith("-py3-none-linux_x86_64.whl"), names


def test_the_core_wheel_carries_the_chat_page(dist):
    core = next(dist.glob("llamaplug-*.whl"))
    names = set(zipfile.ZipFile(core).namelist())
    for page_file in ("index.html", "chat.js", "chat.css"):
        assert f"llamaplug/server/static/{page_file}" in names, page_file


def test_core_and_cpu_install_from_the_folder_alone_and_generate(dist, tmp_path, smollm2_path, llama):
    env_dir = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(dist),
                           "llamaplug", "llamaplug-backend-cpu"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    code = (f"import llamaplug as lp; llama = lp.Llama.load(lp.LlamaParams({str(smollm2_path)!r}, n_ctx=2048, "
            f"n_threads={THREADS})); print(lp.__file__); "
            "print(llama.create_completion('The capital of France is', 16).tokens)")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    location, tokens = done.stdout.strip().splitlines()[-2:]
    assert location.startswith(str(env_dir))  # the fresh venv's copy, not the suite's
    ours = llama.create_completion("The capital of France is", 16).tokens
    assert ast.literal_eval(tokens) == ours
