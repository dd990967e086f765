"""`import llamaplug` is light and every public name still comes from it.

The package loads its names when first asked for (PEP 562), so that the CLI's parser, a plugin's
`from llamaplug import hookimpl` and `llamaplug serve`'s first steps do not import pydantic, numpy and
every layer before the model's load can start. Checked in a child interpreter (this one has them all).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import llamaplug

HEAVY = ("pydantic", "numpy", "fastapi", "jinja2", "tokenizers", "urllib.request", "llamaplug.params",
         "llamaplug.high.llama")


def imported_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nimport json; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("code", [
    "import llamaplug",
    "import llamaplug.cli",
    "import llamaplug.cli as c; c.parser()",  # loads every installed plugin (their packages too)
])
def test_the_package_and_the_cli_parser_import_nothing_heavy(code):
    loaded = imported_after(code)
    heavy = {m for m in HEAVY if m in loaded}
    assert not heavy, f"{code!r} imported {sorted(heavy)}"


def test_a_planted_eager_import_is_seen():
    assert "pydantic" in imported_after("import llamaplug; llamaplug.LlamaParams")


@pytest.mark.parametrize("name", sorted(llamaplug.__all__))
def test_every_public_name_resolves(name):
    value = getattr(llamaplug, name)
    assert value is not None
    assert name in dir(llamaplug)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'LlamaModle'"):
        llamaplug.LlamaModle  # noqa: B018


def test_the_raw_flow_loads_the_plugins_backends_without_the_blocks_imported():
    """Seed 003's raw flow: llama_backend_init registers the installed backends though nothing imported blocks."""
    code = ("import llamaplug.raw as r, sys\nassert 'llamaplug.blocks.backend' not in sys.modules\n"
            "r.llama_backend_init()\nprint(r.lib.ggml_backend_reg_count())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert int(done.stdout.strip().splitlines()[-1]) >= 1
