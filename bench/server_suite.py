#!/usr/bin/env python3
"""The pinned llama-server's own test suite (tools/server/tests), run against the pin's llama-server and against
`llamaplug serve`, with its test model swapped for SmolLM2 (issue 48 part 6).

    .tox/py/bin/python bench/server_suite.py [--files test_basic.py test_chat_completion.py ...] [--keep DIR]

The suite is copied from the pinned tree; a conftest beside its tests swaps the `tinyllama2` preset's Hugging Face
repository for SmolLM2's local GGUF (the suite would download stories260K) and skips the preset download. The suite's
own requirements live in a venv of their own (made at the first run), and each server is the executable the suite
starts (`LLAMA_SERVER_BIN_PATH`): the native llama-server, or a two-line script running `llamaplug serve` with the
same arguments. The report: per file, what each passes, and every test llama-server passes and llamaplug does not
(with llamaplug's first error line). Many of the suite's assertions are written for stories260K's text, so a test
both fail says nothing; the count that matters is llamaplug's passes among llama-server's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The files whose servers use the `tinyllama2` preset (the others need models with no small stand-in: embeddings,
# rerank, LoRA, vision, draft models, infill, a router of presets).
FILES = ["test_basic.py", "test_chat_completion.py", "test_completion.py", "test_compat_anthropic.py",
         "test_compat_oai_responses.py", "test_ctx_shift.py", "test_ignore_eos.py", "test_kv_keep_only_active.py",
         "test_metrics.py", "test_security.py", "test_slot_save.py", "test_template.py", "test_tokenize.py",
         "test_tool_call.py", "test_stream.py", "test_compat_gcp.py", "test_sleep.py", "test_proxy.py",
         # the router preset (no model: llama-server's router mode, serve's default model) with --tools all
         "test_tools_builtin.py"]
REQUIREMENTS = ["aiohttp", "pytest", "filelock", "numpy", "openai>=2", "prometheus-client", "requests", "wget",
                "jsonschema"]

SWAP = textwrap.dedent('''
    """Added by llamaplug's bench/server_suite.py: the tinyllama2 preset serves a local GGUF, nothing is downloaded."""
    import os

    import pytest
    from utils import ServerPreset

    _tinyllama2 = ServerPreset.tinyllama2


    def _local():
        server = _tinyllama2()
        server.model_hf_repo = server.model_hf_file = server.model_url = None
        server.model_file = os.environ["SUITE_MODEL"]
        # one thread: on a shared 2-core machine two ggml threads spin on each other's core (prompt 1.4 s a token)
        server.n_threads = int(os.environ.get("SUITE_THREADS", "1"))
        return server


    ServerPreset.tinyllama2 = staticmethod(_local)


    @pytest.fixture(scope="session", autouse=True)
    def load_server_presets():
        pass
''')


def _venv(path: Path) -> Path:
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True)
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _results(xml: Path) -> dict[str, str]:
    """test id -> "passed", "skipped" or its first failure line."""
    out = {}
    for case in ET.parse(xml).iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            out[name] = (bad.get("message") or "failed").splitlines()[0][:200]
        else:
            out[name] = "skipped" if case.find("skipped") is not None else "passed"
    return out


def run_suite(python: Path, suite: Path, server: str, files: list[str], model: Path, xml: Path,
              mark: str | None = None) -> dict[str, str]:
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": server, "SUITE_MODEL": str(model), "PORT": str(_free_port()),
           "LLAMA_CACHE": str(suite / "cache")}
    subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                    *(["-m", mark] if mark else []), *[f"unit/{f}" for f in files]], cwd=suite, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _results(xml)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", nargs="*", default=FILES)
    ap.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "llamaplug-server-suite-venv")
    ap.add_argument("--keep", type=Path, help="copy the suite here and keep it (default: a temporary directory)")
    # "not slow": test_tool_call's slow tests each download a real model (Llama, Qwen, Hermes...) from the Hub
    ap.add_argument("--mark", help="pytest -m expression passed to both runs, e.g. 'not slow'")
    ap.add_argument("--reuse-native", action="store_true", help="take llama-server's results from --keep's last run")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "server_suite" / "latest.json")
    args = ap.parse_args()

    sys.path[:0] = [str(ROOT / "vendor" / "llama.cpp")]
    import fetch
    import native_tools
    from llamaplug.catalog import default_model

    pinned, model = fetch.materialise(), default_model("smollm2-135m-instruct")
    llama_server = native_tools.build(("llama-server",)) / "llama-server"
    python = _venv(args.venv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="server-suite-"))
    # where the pinned tree has it: test_tools_builtin.py reads and searches its files from the tree's root (work)
    suite = work / "tools" / "server" / "tests"
    shutil.rmtree(suite, ignore_errors=True)
    shutil.copytree(pinned / "tools" / "server" / "tests", suite)
    # and the templates its tests name as ../../../models/templates/... (assistant prefill, test_tool_call, ...)
    shutil.rmtree(work / "models" / "templates", ignore_errors=True)
    shutil.copytree(pinned / "models" / "templates", work / "models" / "templates")
    (suite / "unit" / "conftest.py").write_text(SWAP)
    ours = work / "llamaplug-serve"
    ours.write_text(f'#!/bin/sh\nexec {sys.executable} -m llamaplug.cli serve "$@"\n')
    ours.chmod(0o755)

    if args.reuse_native and (work / "native.xml").exists():  # llama-server's side of an earlier run in --keep
        native = _results(work / "native.xml")
    else:
        native = run_suite(python, suite, str(llama_server), args.files, model, work / "native.xml", args.mark)
    plug = run_suite(python, suite, str(ours), args.files, model, work / "llamaplug.xml", args.mark)
    passed_native = {t for t, r in native.items() if r == "passed"}
    passed_both = {t for t in passed_native if plug.get(t) == "passed"}
    for name in args.files:
        stem = name.removesuffix(".py")
        mine = [t for t in native if t.startswith(stem + "::")]
        print(f"{name:34} llama-server {sum(native[t] == 'passed' for t in mine):3}  "
              f"llamaplug {sum(plug.get(t) == 'passed' for t in mine):3}  of {len(mine)}")
    print(f"llama-server passes {len(passed_native)}; llamaplug passes {len(passed_both)} of those "
          f"({len(passed_both) / max(1, len(passed_native)):.2f}) and "
          f"{sum(r == 'passed' for r in plug.values()) - len(passed_both)} that llama-server fails")
    missing = {t: plug.get(t, "not run") for t in sorted(passed_native - passed_both)}
    for test, why in missing.items():
        print(f"  {test}: {why}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"files": args.files, "llama_server": native, "llamaplug": plug,
                                    "missing": missing}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
