"""No native code but our own: a libggml-*.so planted where ggml would search is never loaded.

Upstream ggml's module search (ggml_backend_load_all, reached from llama_backend_init,
llama_supports_gpu_offload and llama_supports_rpc while no backend is registered)
dlopens every libggml-<backend>-*.so in the executable's folder and in the working
directory, and the file GGML_BACKEND_PATH names. Each library planted here writes a
marker line from its constructor, so loading it at all, even just to ask its score,
shows. Every public entry point runs in a child whose working directory and executable
folder hold the planted files (the executable is a copied Python, so its folder is
ours to write); the positive controls show the same files do run when ggml is told
to load them.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
import textwrap
import venv
from pathlib import Path

import pytest
from llamaplug_testing import THREADS

PLANTED = ["libggml-cpu-planted.so", "libggml-cuda.so", "libggml-cuda-planted.so", "libggml-rpc-planted.so",
           "libggml-vulkan.so", "libggml-blas.so", "libggml-anything.so"]

SOURCE = r"""
#include <stdio.h>
static void mark(void) __attribute__((constructor));
static void mark(void) {
    FILE * f = fopen(MARKER, "a");
    if (f) { fputs(NAME "\n", f); fclose(f); }
}
int ggml_backend_score(void) { return 1000; }   /* the best score: ggml would pick this file */
void * ggml_backend_init(void) { return 0; }
"""


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict[str, Path]:
    """A working directory and a copied Python's bin/ both holding the planted libraries."""
    root = tmp_path_factory.mktemp("planted")
    marker = root / "marker.txt"
    env_dir = root / "venv"
    venv.EnvBuilder(symlinks=False, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    assert not python.is_symlink()
    cwd = root / "work"
    cwd.mkdir()
    src = root / "planted.c"
    src.write_text(SOURCE)
    for folder in (cwd, python.parent):
        for name in PLANTED:
            subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / name), str(src),
                            f'-DMARKER="{marker}"', f'-DNAME="{folder.name}/{name}"'], check=True)
    return {"cwd": cwd, "python": python, "marker": marker, "bin": python.parent}


def run_planted(planted, code: str, *args: str, env: dict | None = None, timeout: float = 180):
    """`code` (or `python -m args`) in a child: cwd and executable folder full of planted libraries."""
    planted["marker"].unlink(missing_ok=True)
    child_env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]), **(env or {}))
    cmd = [str(planted["python"]), *(["-c", textwrap.dedent(code)] if code else args)]
    done = subprocess.run(cmd, cwd=planted["cwd"], capture_output=True, text=True, timeout=timeout, env=child_env)
    loaded = planted["marker"].read_text().split() if planted["marker"].exists() else []
    return done, loaded


def test_the_child_runs_from_the_planted_folders(planted):
    done, _ = run_planted(planted, "import os, sys; print(os.getcwd()); print(os.path.realpath('/proc/self/exe'))")
    assert done.returncode == 0, done.stderr
    cwd, exe = done.stdout.split()
    assert Path(cwd) == planted["cwd"] and Path(exe).parent == planted["bin"]


def test_planted_libraries_run_when_ggml_is_told_to_load_them(planted):
    # Positive control: an explicit folder is searched, constructors run, so a marker-free run means something.
    done, loaded = run_planted(planted, f"""
        import llamaplug.raw as raw
        raw.lib.ggml_backend_load_all_from_path({str(planted['cwd']).encode()!r})
    """)
    assert done.returncode == 0, done.stderr
    assert any(name.startswith("work/libggml-cpu-planted") for name in loaded), loaded


ENTRY_POINTS = {
    "LlamaBackend.init": "import llamaplug as lp; lp.LlamaBackend.init()",
    "Llama.load": """
        import llamaplug as lp
        from llamaplug.catalog import default_model
        llama = lp.Llama.load(lp.LlamaParams(default_model(), n_ctx=256, n_threads={threads}))
        assert llama.create_completion("Hi", max_tokens=2).tokens
    """,
    "raw seed-003 flow": """
        import llamaplug.raw as raw
        from llamaplug.catalog import default_model
        raw.llama_backend_init()
        model = raw.llama_model_load_from_file(str(default_model()).encode(), raw.llama_model_default_params())
        assert model != raw.ffi.NULL, "the raw flow could not load the model"
        raw.llama_model_free(model)
        raw.llama_backend_free()
    """,
    "raw capability calls first": """
        import llamaplug.raw as raw
        print(raw.llama_supports_gpu_offload(), raw.llama_supports_rpc())
    """,
    # Past our Python wrappers, straight into llama.cpp: the core's ggml itself searches nothing.
    "raw lib.llama_backend_init": "import llamaplug.raw as raw; raw.lib.llama_backend_init()",
    "raw lib.ggml_backend_load_all": "import llamaplug.raw as raw; raw.lib.ggml_backend_load_all()",
    "raw lib.llama_supports_gpu_offload": "import llamaplug.raw as raw; raw.lib.llama_supports_gpu_offload()",
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_no_entry_point_loads_a_planted_library(planted, entry):
    done, loaded = run_planted(planted, ENTRY_POINTS[entry].format(threads=THREADS),
                               env={"GGML_BACKEND_PATH": str(planted["cwd"] / "libggml-anything.so")})
    assert done.returncode == 0, f"{entry} failed:\n{done.stderr[-3000:]}"
    assert loaded == [], f"{entry} loaded planted libraries: {loaded}"


@pytest.mark.parametrize("args", [["info"], ["run", "-n", "2", "--temp", "0", "-c", "256", "-t", str(THREADS), "Hi"]],
                         ids=["info", "run"])
def test_the_cli_loads_no_planted_library(planted, args):
    done, loaded = run_planted(planted, "", "-m", "llamaplug.cli", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert loaded == [], loaded


def test_ggml_backend_path_counts_only_with_llamaplugs_setting(planted):
    module = planted["cwd"] / "libggml-anything.so"
    code = """
        import llamaplug as lp
        try:
            lp.LlamaBackend.init()
        except lp.BackendError as e:
            print("BackendError:", e)
        else:
            print("statuses:", [(s.name, s.loaded, s.reason) for s in lp.backends()])
    """
    done, loaded = run_planted(planted, code, env={"GGML_BACKEND_PATH": str(module)})
    assert done.returncode == 0 and loaded == [], (done.stderr, loaded)
    assert "LLAMAPLUG_TRUST_GGML_BACKEND_PATH=1" in done.stdout  # the status says how to opt in

    done, loaded = run_planted(planted, code, env={"GGML_BACKEND_PATH": str(module),
                                                   "LLAMAPLUG_TRUST_GGML_BACKEND_PATH": "1"})
    assert done.returncode == 0, done.stderr
    assert loaded == ["work/libggml-anything.so"]  # loaded, as asked: its init returns NULL, which is reported
    assert "BackendError:" in done.stdout and str(module) in done.stdout

