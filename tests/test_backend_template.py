"""The backend plugins are copies of plugins/_template: rendering it for a backend gives that backend's files.

What a backend keeps of the template is listed below; a change to one backend's copy (or to the template)
that the others do not follow fails here. What is not listed is what the backend does differently.
"""

from __future__ import annotations

import ast
import importlib.util
import re

import pytest
from llamaplug_testing import REPO, run_isolated

spec = importlib.util.spec_from_file_location("new_backend", REPO / "scripts" / "new_backend.py")
new_backend = importlib.util.module_from_spec(spec)
spec.loader.exec_module(new_backend)

# backend: (OPTION, module name after ggml-, {file: how much of the rendered template it keeps}):
# "same" to the letter; "lines" the template's lines in order, with the backend's own lines between them;
# "functions" the template's functions, the same code (decorators and docstrings aside).
KEPT = {
    "cpu": ("CPU", "cpu", {"pyproject.toml": "same"}),  # CPU variants instead of one module
    "cuda": ("CUDA", "cuda", {"CMakeLists.txt": "lines", "tests/test_cuda_probe.py": "functions"}),  # NVIDIA's wheels
    "metal": ("METAL", "metal", {"pyproject.toml": "same", "CMakeLists.txt": "lines", "README.md": "same",
                                 "tests/test_metal_probe.py": "functions"}),
    "rocm": ("HIP", "hip", {"pyproject.toml": "same", "CMakeLists.txt": "lines", "README.md": "same",
                            "src/llamaplug_backend_rocm/__init__.py": "functions",
                            "tests/test_rocm_probe.py": "functions"}),
    "rpc": ("RPC", "rpc", {"pyproject.toml": "same", "CMakeLists.txt": "same"}),
    "vulkan": ("VULKAN", "vulkan", {"pyproject.toml": "same", "CMakeLists.txt": "same"}),
}


def rendered(backend: str) -> dict[str, str]:
    option, module, _ = KEPT[backend]
    folder = REPO / "plugins" / f"backend_{backend}"
    # The description's own part, between the words every backend's description shares.
    found = re.search(r'^description = "llamaplug compute backend: (.*), built from llamaplug\'s pinned llama\.cpp"$',
                      (folder / "pyproject.toml").read_text(), re.M)
    assert found, f"plugins/backend_{backend}/pyproject.toml: the description is not the template's"
    what = found.group(1)
    keys = new_backend.values(backend, option, what=what, module=module)
    return {path.as_posix(): text for path, text in new_backend.render(keys).items()}


def functions(source: str) -> dict[str, str]:
    """Top-level functions' code, without decorators and docstrings."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            out[node.name] = ast.dump(ast.Module(body=[node.args, *body], type_ignores=[]))
    return out


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def kept_in_order(template: list[str], real: list[str]) -> bool:
    rest = iter(real)
    return all(any(line == other for other in rest) for line in template)


@pytest.mark.parametrize("backend,file", [(b, f) for b, (_, _, files) in KEPT.items() for f in files])
def test_backend_keeps_the_template(backend, file):
    real = (REPO / "plugins" / f"backend_{backend}" / file).read_text()
    template = rendered(backend)[file]
    mode = KEPT[backend][2][file]
    if mode == "same":
        assert real == template, f"plugins/backend_{backend}/{file} is no longer the template's (plugins/_template)"
    elif mode == "lines":
        assert kept_in_order(lines(template), lines(real)), (
            f"plugins/backend_{backend}/{file} lost or reordered lines of the template's:\n{template}")
    else:
        theirs = functions(real)
        for name, code in functions(template).items():
            assert theirs.get(name) == code, f"{name}() of plugins/backend_{backend}/{file} is not the template's"


def test_a_new_backend_is_complete_and_its_probe_test_passes(tmp_path):
    assert new_backend.main(["demo", "DEMO", "--plugins", str(tmp_path)]) == 0
    folder = tmp_path / "backend_demo"
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files == ["CMakeLists.txt", "README.md", "pyproject.toml", "src/llamaplug_backend_demo/__init__.py",
                     "src/llamaplug_backend_demo/probe.py", "tests/test_demo_probe.py"]
    assert not any("{{" in (folder / f).read_text() for f in files)
    pyproject = (folder / "pyproject.toml").read_text()
    assert 'name = "llamaplug-backend-demo"' in pyproject
    assert '[project.entry-points.llamaplug]\nbackend_demo = "llamaplug_backend_demo"' in pyproject
    assert "llamaplug_backend_module(DEMO ggml-demo llamaplug_backend_demo)" in (folder / "CMakeLists.txt").read_text()
    done = run_isolated("import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests']))",
                        path=str(folder / "src"), cwd=folder)
    assert done.returncode == 0 and "3 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert new_backend.main(["demo", "DEMO", "--plugins", str(tmp_path)]) == 1  # never over an existing folder
    assert new_backend.main(["Demo-2", "DEMO", "--plugins", str(tmp_path)]) == 1
