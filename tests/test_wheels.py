"""The distributions as a package index takes them, and as a user installs them from one.

Two ways in (docs/packaging.md):
- in the suite (CI): scripts/dist.py builds the core, the CPU plugin (this machine's variant only,
  LLAMAPLUG_CPU_VARIANTS=host) and the RPC plugin into a temporary folder, from the build folders
  the suite's own install used, so only packaging, repair and one sdist build are new work (about
  2-3 minutes on 2 cores);
- `make dist` sets LLAMAPLUG_DIST=dist: the same tests then check what it built, every distribution
  this machine builds, with every x86 CPU variant; nothing is rebuilt.
"""

from __future__ import annotations

import ast
import email.parser
import json
import os
import re
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest
from llamaplug_testing import REPO, THREADS
from llamaplug_testing.simple_index import simple_index

pytestmark = pytest.mark.slow

VERSION = (REPO / "VERSION").read_text().strip()
MADE_BY_MAKE_DIST = os.environ.get("LLAMAPLUG_DIST")
# What `make dist` builds here; make cuda-wheel / gpu-kit add backend_cuda.
EVERY = ("llamaplug", "llamaplug_backend_cpu", "llamaplug_backend_rpc", "llamaplug_backend_vulkan", "llamaplug_mtmd",
         "llamaplug_tokenizer_hf", "llamaplug_llguidance")
EXPECTED = EVERY if MADE_BY_MAKE_DIST else ("llamaplug", "llamaplug_backend_cpu", "llamaplug_backend_rpc")
PURE = {"llamaplug_tokenizer_hf", "llamaplug_llguidance"}
# What a wheel may leave to another wheel it depends on or to the machine (docs/packaging.md says why), nothing else.
CORE = {"libggml-base.so"}
LEFT_OUT = {"llamaplug": set(), "llamaplug_backend_cpu": CORE, "llamaplug_backend_rpc": CORE,
            "llamaplug_backend_vulkan": CORE | {"libvulkan.so.1"},
            "llamaplug_backend_cuda": CORE | {"libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13",
                                              "libcuda.so.1"},
            "llamaplug_mtmd": CORE | {"libllama.so", "libggml.so"}}
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    if MADE_BY_MAKE_DIST:
        return Path(MADE_BY_MAKE_DIST).resolve()
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "dist.py"), "--out", str(out), "core",
                           "backend_cpu", "backend_rpc"], capture_output=True, text=True, timeout=1800,
                          env=dict(os.environ, LLAMAPLUG_CPU_VARIANTS="host"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return out


def wheels(dist: Path) -> dict[str, Path]:
    return {p.name.split("-")[0]: p for p in dist.glob("llamaplug*.whl")}


def metadata(text: str) -> email.message.Message:
    return email.parser.Parser().parsestr(text)


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return metadata(zf.read(name).decode())


def test_every_distribution_has_an_sdist_and_a_wheel(dist):
    for name in EXPECTED:
        assert len(list(dist.glob(f"{name}-{VERSION}.tar.gz"))) == 1, (name, sorted(p.name for p in dist.iterdir()))
        assert len(list(dist.glob(f"{name}-{VERSION}-*.whl"))) == 1, (name, sorted(p.name for p in dist.iterdir()))


def test_native_wheels_are_manylinux_per_auditwheel(dist):
    for name, wheel in wheels(dist).items():
        if name in PURE:
            assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
            continue
        # The core's cffi module uses only the stable ABI; the plugins hold ggml modules loaded by path.
        python_tags = "-cp310-abi3-" if name in ("llamaplug", "llamaplug_mtmd") else "-py3-none-"
        assert python_tags in wheel.name and re.search(r"-manylinux_2_\d+_x86_64\.whl$", wheel.name), wheel.name
        done = subprocess.run([str(BIN / "auditwheel"), "show", "--json", str(wheel)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        shown = json.loads(done.stdout)
        # The symbol versions it uses allow the tag it has; what it links outside itself is only what may be left out.
        assert shown["sym_tag"] in wheel.name, (wheel.name, shown["sym_tag"])
        assert set(shown["external_libs"]) <= LEFT_OUT[name], (wheel.name, shown["external_libs"])
        if not shown["external_libs"]:
            assert shown["overall_tag"] == shown["sym_tag"], (wheel.name, shown["overall_tag"])


def test_twine_check_passes(dist):
    files = sorted(str(p) for p in dist.glob("llamaplug*") if p.name.endswith((".whl", ".tar.gz")))
    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *files], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("PASSED") == len(files), done.stdout


def test_versions_and_pins_agree(dist):
    for name, wheel in wheels(dist).items():
        meta = wheel_metadata(wheel)
        assert meta["Version"] == VERSION, (wheel.name, meta["Version"])
        requires = meta.get_all("Requires-Dist") or []
        if name != "llamaplug":
            assert f"llamaplug=={VERSION}" in requires, (wheel.name, requires)
        if name == "llamaplug_backend_cuda":
            assert {r.split(">")[0].split("<")[0] for r in requires} >= {"nvidia-cuda-runtime", "nvidia-cublas"}
    for sdist in dist.glob("llamaplug*.tar.gz"):
        with tarfile.open(sdist) as tar:
            member = next(m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
            meta = metadata(tar.extractfile(member).read().decode())
        assert meta["Version"] == VERSION, (sdist.name, meta["Version"])


def _runpaths(wheel: Path, tmp_path: Path) -> dict[str, list[str]]:
    root = tmp_path / wheel.stem
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(root)
    found = {}
    for f in root.rglob("*.so"):
        out = subprocess.run(["readelf", "-d", str(f)], capture_output=True, text=True, check=True).stdout
        paths = re.findall(r"\((?:RUNPATH|RPATH)\).*\[(.+)\]", out)
        found[str(f.relative_to(root))] = paths[0].split(":") if paths else []
    return found


def test_repaired_modules_still_reach_the_cores_ggml_and_nvidias_wheels(dist, tmp_path):
    """auditwheel drops RUNPATH entries that leave the wheel; ours lead to the core's and NVIDIA's on purpose."""
    for name, wheel in wheels(dist).items():
        if name in PURE or name == "llamaplug":
            continue
        for rel, runpath in _runpaths(wheel, tmp_path).items():
            if "/lib/libggml-" in f"/{rel}" or rel.startswith("llamaplug_mtmd/lib/"):
                assert "$ORIGIN/../../llamaplug/lib" in runpath, (wheel.name, rel, runpath)
            if "libggml-cuda" in rel:
                assert "$ORIGIN/../../nvidia/cu13/lib" in runpath, (wheel.name, rel, runpath)


def test_the_core_wheel_carries_the_chat_page(dist):
    names = set(zipfile.ZipFile(wheels(dist)["llamaplug"]).namelist())
    for page_file in ("index.html", "chat.js", "chat.css"):
        assert f"llamaplug/server/static/{page_file}" in names, page_file


def test_an_sdist_builds_a_wheel_away_from_the_repository(dist, tmp_path):
    """The sdist carries what its build reads outside its folder (_shared/); RPC is the quickest native one."""
    sdist = next(dist.glob(f"llamaplug_backend_rpc-{VERSION}.tar.gz"))
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    top = f"llamaplug_backend_rpc-{VERSION}"
    for shared in ("VERSION", "cmake/llamaplug.cmake", "vendor/llama.cpp/fetch.py", "vendor/llama.cpp/PIN"):
        assert f"{top}/_shared/{shared}" in names, shared
    assert not any("/build/" in n or n.endswith(".so") for n in names), [n for n in names if "/build/" in n][:5]
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w",
                           str(tmp_path / "out"), str(sdist)], capture_output=True, text=True, timeout=1200,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    (built,) = (tmp_path / "out").glob("*.whl")
    assert wheel_metadata(built)["Version"] == VERSION
    assert any(n.endswith("lib/libggml-rpc.so") for n in zipfile.ZipFile(built).namelist())


@pytest.fixture(scope="module")
def dependencies(dist, tmp_path_factory) -> Path:
    """The wheels our two distributions need from PyPI, downloaded as pip would resolve them."""
    out = tmp_path_factory.mktemp("deps")
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(out),
                           "--find-links", str(dist), "llamaplug[server]", "llamaplug-backend-cpu"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    for ours in out.glob("llamaplug*"):
        ours.unlink()  # the index serves dist/'s own
    return out


def test_core_and_cpu_install_from_a_local_index_and_generate(dist, dependencies, tmp_path, smollm2_path, llama):
    env_dir = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # Plain pip, this index alone: no pip.conf (find-links, extra indexes) of this machine.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    with simple_index([dist, dependencies], tmp_path / "index") as url:
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-cache-dir", "--index-url", url,
                               "llamaplug[server]", "llamaplug-backend-cpu"], capture_output=True, text=True,
                              timeout=600, env=dict(clean, PIP_CONFIG_FILE=os.devnull), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # uvloop and httptools too: the server extra's fast path, what the benchmarks measured
    code = ("import llamaplug as lp, fastapi, uvicorn, uvloop, httptools; "
            f"llama = lp.Llama.load(lp.LlamaParams({str(smollm2_path)!r}, n_ctx=2048, n_threads={THREADS})); "
            "print(lp.__file__); "
            "print(llama.create_completion('The capital of France is', 16).tokens)")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300, env=clean,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    location, tokens = done.stdout.strip().splitlines()[-2:]
    assert location.startswith(str(env_dir))  # the fresh venv's copy, not the suite's
    ours = llama.create_completion("The capital of France is", 16).tokens
    assert ast.literal_eval(tokens) == ours
    # The CPU module finds the core's ggml-base through its RUNPATH, not by luck of load order.
    module = next((env_dir / "lib").glob("python3*/site-packages/llamaplug_backend_cpu/lib/libggml-cpu-*.so"))
    resolved = subprocess.run(["ldd", str(module)], capture_output=True, text=True, env=clean).stdout
    line = next(line for line in resolved.splitlines() if "libggml-base.so" in line)
    found = Path(line.split("=>")[1].split("(")[0].strip()).resolve()
    assert found == (module.parent.parent.parent / "llamaplug" / "lib" / "libggml-base.so").resolve(), resolved
