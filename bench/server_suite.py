#!/usr/bin/env python3
"""The pinned llama-server's own test suite (tools/server/tests), run against the pin's llama-server and against
`llamaplug serve`, with its test models swapped for local stand-ins (issue 48 part 6).

    .tox/py/bin/python bench/server_suite.py [--files test_basic.py test_chat_completion.py ...] [--keep DIR]

The suite is copied from the pinned tree; a conftest beside its tests swaps each preset's Hugging Face repository for
a local stand-in, the same for both servers (SmolLM2 for stories260K, all-MiniLM-L6-v2 for bge-small, generated files
for the reranker, projector, LoRA adapter and images: `stand_ins`, and SWAP's docstring), and skips the preset
download. The suite's own requirements live in a venv of their own (made at the first run), and each server is the
executable the suite starts (`LLAMA_SERVER_BIN_PATH`): the native llama-server, or a two-line script running
`llamaplug serve` with the same arguments. The report: per file, what each passes, and every test llama-server
passes and llamaplug does not (with llamaplug's first error line). Many of the suite's assertions are written for
the real models' text (stories260K, tinygemma3, ...), so a test both fail says nothing; the count that matters is
llamaplug's passes among llama-server's.
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
# The files of the suite, each preset's Hugging Face model swapped for a local stand-in (SWAP below says which).
FILES = ["test_basic.py", "test_chat_completion.py", "test_completion.py", "test_compat_anthropic.py",
         "test_compat_oai_responses.py", "test_ctx_shift.py", "test_ignore_eos.py", "test_kv_keep_only_active.py",
         "test_metrics.py", "test_security.py", "test_slot_save.py", "test_template.py", "test_tokenize.py",
         "test_tool_call.py", "test_stream.py", "test_compat_gcp.py", "test_sleep.py", "test_proxy.py",
         # the router preset (no model: llama-server's router mode, serve's default model) with --tools all
         "test_tools_builtin.py", "test_mcp_servers.py",
         # the other presets' stand-ins (issue 48 part 6)
         "test_embedding.py", "test_rerank.py", "test_infill.py", "test_lora.py", "test_speculative.py",
         "test_vision_api.py", "test_router.py"]
REQUIREMENTS = ["aiohttp", "pytest", "filelock", "numpy", "openai>=2", "prometheus-client", "requests", "wget",
                "jsonschema"]

SWAP = textwrap.dedent('''
    """Added by llamaplug's bench/server_suite.py: each preset serves a local stand-in, nothing is downloaded.

    The stand-ins (the bench writes them and names them in SUITE_* variables) are the same for both servers:
    tinyllama2, stories15m_moe (LoRA, speculative) -> SmolLM2; bert_bge_small -> all-MiniLM-L6-v2 (BERT, the same
    WordPiece vocabulary, 384-dim); jina_reranker_tiny -> the tiny generated reranker; tinyllama_infill -> SmolLM2
    with three unused special tokens named as its FIM tokens; tinygemma3 -> SmolLM2 with a generated projector
    (given as LLAMA_ARG_MMPROJ, which both read); the LoRA file -> a generated adapter for SmolLM2; the draft model
    -> SmolLM2 itself; the test images -> generated PNGs served from 127.0.0.1. The router preset: llama-server's
    router lists the Hugging Face
    cache (LLAMA_CACHE, where the bench put the three stand-ins under the ids test_router.py asks for);
    `llamaplug serve` has no router of the cache, so in test_router.py it is given the same three as `-m org/repo:TAG`
    (read from that cache, HF_HUB_CACHE): the same ids, each loaded when first asked.
    """
    import base64
    import functools
    import http.server
    import os
    import threading
    from pathlib import Path

    import pytest
    import utils
    from utils import ServerPreset, ServerProcess

    _presets = {name: getattr(ServerPreset, name) for name in
                ("tinyllama2", "stories15m_moe", "bert_bge_small", "bert_bge_small_with_fa", "jina_reranker_tiny",
                 "tinyllama_infill", "tinygemma3", "router")}
    # one thread: on a shared 2-core machine two ggml threads spin on each other's core (prompt 1.4 s a token)
    THREADS = int(os.environ.get("SUITE_THREADS", "1"))
    NATIVE = os.path.basename(os.environ.get("LLAMA_SERVER_BIN_PATH", "")) == "llama-server"


    def _swapped(name, model, **env):
        def preset():
            server = _presets[name]()
            server.model_hf_repo = server.model_hf_file = server.model_url = None
            server.model_file = os.environ[model]
            server.n_threads = THREADS
            server._suite_env = dict(env)
            return server
        return staticmethod(preset)


    ServerPreset.tinyllama2 = _swapped("tinyllama2", "SUITE_MODEL")
    ServerPreset.stories15m_moe = _swapped("stories15m_moe", "SUITE_MODEL")
    ServerPreset.bert_bge_small = _swapped("bert_bge_small", "SUITE_EMBED")
    ServerPreset.bert_bge_small_with_fa = _swapped("bert_bge_small_with_fa", "SUITE_EMBED")
    ServerPreset.jina_reranker_tiny = _swapped("jina_reranker_tiny", "SUITE_RERANK")
    ServerPreset.tinyllama_infill = _swapped("tinyllama_infill", "SUITE_INFILL")
    ServerPreset.tinygemma3 = _swapped("tinygemma3", "SUITE_MODEL", LLAMA_ARG_MMPROJ=os.environ.get("SUITE_MMPROJ", ""))


    def _router():
        server = _presets["router"]()
        server.n_threads = THREADS
        if not NATIVE and "/test_router.py::" in os.environ.get("PYTEST_CURRENT_TEST", ""):
            server._suite_env = {"SUITE_SERVE_ARGS": os.environ.get("SUITE_ROUTER_MODELS", "")}
        return server


    ServerPreset.router = staticmethod(_router)

    # the URLs the files download (LoRA adapter, draft model) -> local stand-ins
    _FILES = {"moe_shakespeare15M.gguf": "SUITE_LORA", "stories15M-q4_0.gguf": "SUITE_MODEL"}
    _download_file = utils.download_file


    def download_file(url, output_file_path=None):
        name = url.split("/").pop()
        return os.environ[_FILES[name]] if name in _FILES else _download_file(url, output_file_path)


    utils.download_file = download_file  # (before the test files' `from utils import *`)

    _start = ServerProcess.start


    def start(self, *args, **kwargs):
        """The preset's own environment variables for this start only (utils copies os.environ at each start)."""
        extra = {k: v for k, v in getattr(self, "_suite_env", {}).items() if v}
        saved = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)
        try:
            return _start(self, *args, **kwargs)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


    ServerProcess.start = start


    @pytest.fixture(scope="session", autouse=True)
    def load_server_presets():
        pass


    @pytest.fixture(scope="session")
    def _images():
        """test_vision_api's two images (Hugging Face URLs there): generated PNGs, served from 127.0.0.1."""
        folder = os.environ.get("SUITE_IMAGES")
        if not folder:
            yield None
            return
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=folder)
        handler.log_message = lambda *a: None
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        yield folder, f"http://127.0.0.1:{httpd.server_address[1]}"
        httpd.shutdown()


    @pytest.fixture(autouse=True)
    def _local_images(request, monkeypatch, _images):
        original = getattr(request.module, "get_img_url", None)
        if original is None or _images is None:
            return
        folder, base = _images
        names = {"0": "11_truck.png", "1": "91_cat.png"}

        def get_img_url(id):
            if id.startswith("IMG_") and id[-1] in names:
                name = names[id[-1]]
                if id.startswith("IMG_URL_"):
                    return f"{base}/{name}"
                data = base64.b64encode(Path(folder, name).read_bytes()).decode("utf-8")
                return ("data:image/png;base64," + data) if "_URI_" in id else data
            return original(id)

        monkeypatch.setattr(request.module, "get_img_url", get_img_url)
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


# test_router.py's models (the ids it asks for) -> the stand-in each is in the Hugging Face cache of both runs
ROUTER_MODELS = {"ggml-org/tinygemma3-GGUF": "tinygemma3-Q8_0.gguf",
                 "ggml-org/test-model-stories260K": "stories260K-F32.gguf",
                 "ggml-org/test-model-stories260K-infill": "stories260K-infill-F32.gguf"}
# SmolLM2 names no FIM tokens (llama.cpp finds its <repo_name> and <file_sep> as FIM_REP and FIM_SEP by their
# text): the infill stand-in is SmolLM2 with three of its unused special tokens named as prefix, suffix and middle
FIM_IDS = ["--special-token-by-id", "fim_pre", "11", "--special-token-by-id", "fim_suf", "12",
           "--special-token-by-id", "fim_mid", "13"]  # <jupyter_start>, <jupyter_text>, <jupyter_code>
ROUTER_TAGS = {"ggml-org/tinygemma3-GGUF": "Q8_0", "ggml-org/test-model-stories260K": "F32",
               "ggml-org/test-model-stories260K-infill": "F32"}


def stand_ins(pinned: Path, model: Path, folder: Path, cache: Path) -> dict[str, str]:
    """The local files that stand in for the presets' Hugging Face models (SUITE_* variables of the conftest)."""
    sys.path[:0] = [str(ROOT / "tests")]
    from fixtures import tiny_gguf
    from fixtures.adapters import write_lora
    from fixtures.minilm import gguf_path
    from fixtures.tiny_mmproj import png_bytes, sample_image, write_tiny_mmproj

    folder.mkdir(parents=True, exist_ok=True)
    infill = folder / "smollm2-fim.gguf"
    if not infill.exists():  # SmolLM2 names no FIM tokens: three of its unused special tokens take the roles
        subprocess.run([sys.executable, str(pinned / "gguf-py" / "gguf" / "scripts" / "gguf_new_metadata.py"),
                        str(model), str(infill), "--force", *FIM_IDS], check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(pinned / "gguf-py")})
    # the tiny reranker with a longer training context: llama-server caps n_ctx at it, and test_rerank's documents
    # are ~140 tokens each of its 64-token vocabulary (at 128, every request with them is a 400 on both servers)
    tiny_gguf.N_CTX_TRAIN = 1024
    reranker = tiny_gguf.write_tiny_reranker(folder / "tiny-reranker-1024.gguf")
    images = folder / "images"
    images.mkdir(exist_ok=True)
    for name, seed in (("11_truck.png", 7), ("91_cat.png", 8)):
        (images / name).write_bytes(png_bytes(sample_image(48, 64, seed)))
    # the router's cache: llama-server's LLAMA_CACHE and serve's HF_HUB_CACHE, one snapshot per repository
    for repo, name in ROUTER_MODELS.items():
        repo_dir = cache / ("models--" + repo.replace("/", "--"))
        snapshot = repo_dir / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs").mkdir(exist_ok=True)
        (repo_dir / "refs" / "main").write_text("0" * 40)
        if not (snapshot / name).exists():
            # a link of its own, never a symlink: llama-server's DELETE /models removes what a symlink points to
            try:
                os.link(model, snapshot / name)
            except OSError:  # (another file system)
                shutil.copyfile(model, snapshot / name)
    return {"SUITE_MODEL": str(model),
            "SUITE_EMBED": str(gguf_path(pinned)),
            "SUITE_RERANK": str(reranker),
            "SUITE_INFILL": str(infill),
            "SUITE_LORA": str(write_lora(folder / "lora-smollm2.gguf")),
            "SUITE_MMPROJ": str(write_tiny_mmproj(folder / "mmproj-smollm2.gguf", out_embd=576)),
            "SUITE_IMAGES": str(images),
            "SUITE_ROUTER_MODELS": " ".join(f"-m {repo}:{ROUTER_TAGS[repo]}" for repo in ROUTER_MODELS),
            "LLAMA_CACHE": str(cache), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def run_suite(python: Path, suite: Path, server: str, files: list[str], inputs: dict[str, str], xml: Path,
              mark: str | None = None) -> dict[str, str]:
    env = {**os.environ, **inputs, "LLAMA_SERVER_BIN_PATH": server, "PORT": str(_free_port())}
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
    # and the image test_security.py's test_local_media_file reads through --media-path ../../../tools
    (work / "tools" / "mtmd").mkdir(parents=True, exist_ok=True)
    shutil.copy(pinned / "tools" / "mtmd" / "test-1.jpeg", work / "tools" / "mtmd" / "test-1.jpeg")
    (suite / "unit" / "conftest.py").write_text(SWAP)
    (suite / "tmp").mkdir(exist_ok=True)  # test_router.py writes its INI presets there (utils.TMP_DIR)
    inputs = stand_ins(pinned, model, work / "stand-ins", suite / "cache")
    ours = work / "llamaplug-serve"
    # SUITE_SERVE_ARGS: what test_router.py's router preset adds for serve (the conftest sets it for that start)
    ours.write_text(f'#!/bin/sh\nexec {sys.executable} -m llamaplug.cli serve "$@" $SUITE_SERVE_ARGS\n')
    ours.chmod(0o755)

    if args.reuse_native and (work / "native.xml").exists():  # llama-server's side of an earlier run in --keep
        native = _results(work / "native.xml")
    else:
        native = run_suite(python, suite, str(llama_server), args.files, inputs, work / "native.xml", args.mark)
    plug = run_suite(python, suite, str(ours), args.files, inputs, work / "llamaplug.xml", args.mark)
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
