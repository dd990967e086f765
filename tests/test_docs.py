"""The documentation: the site builds with --strict, and its examples (and the README's) run.

A renamed API breaks this test instead of the docs. Blocks that cannot run here say why
(`<!-- docs-test: skip (reason) -->`, tests/llamaplug_testing/doc_examples.py); at least 90 % run.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from llamaplug_testing import REPO, run_isolated
from llamaplug_testing.doc_examples import blocks, page_program, pages

PAGES = [p for p in pages() if any(b.skip is None for b in blocks(p))]


def _id(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.lang == "python" and b.skip is None for b in blocks(p))],
                         ids=_id)
def test_python_examples_run(page: Path, tmp_path: Path) -> None:
    done = run_isolated(page_program(blocks(page)), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, f"an example of {_id(page)} failed:\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.lang == "console" and b.skip is None for b in blocks(p))],
                         ids=_id)
def test_console_examples_run(page: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for block in blocks(page):
        if block.lang != "console" or block.skip is not None:
            continue
        for command in block.commands():
            done = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, f"{block.where}: `{command}` failed:\n{done.stderr[-3000:]}"


def test_most_examples_run() -> None:
    every = [b for p in pages() for b in blocks(p)]
    skipped = [b for b in every if b.skip is not None]
    share = 1 - len(skipped) / len(every)
    summary = "; ".join(f"{b.where} ({b.skip})" for b in skipped) or "none"
    warnings.warn(f"docs examples: {len(every) - len(skipped)} of {len(every)} run, skipped: {summary}",
                  stacklevel=1)
    assert share >= 0.9, f"only {share:.0%} of the docs' examples run; skipped: {summary}"


def test_site_builds_strict(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "context-api" / "index.html").read_text().count("<tr>") > 100
