"""Hub loading (`Llama.from_pretrained`, `llamaplug run org/repo:TAG`) without the network.

A hub-shaped HTTP endpoint on 127.0.0.1 (model info, resolve with HEAD/GET, the Hub's error headers)
serves tiny generated GGUFs, so huggingface_hub's own download path runs into a temporary cache;
then HF_HUB_OFFLINE reads that cache only, and a cache laid out by hand
(models--org--repo/{blobs,snapshots/<sha>,refs/main}) is read with no server at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from fixtures.tiny_gguf import model_bytes, write_tiny_model

import llamaplug as lp
from llamaplug.high import hub

huggingface_hub = pytest.importorskip("huggingface_hub", reason='the hub extra: pip install "llamaplug[hub]"')
gguf = pytest.importorskip("gguf", reason="gguf-py (tox installs it) writes the split model")
hub_constants = pytest.importorskip("huggingface_hub.constants")  # the package loads its submodules lazily
hub_file_download = pytest.importorskip("huggingface_hub.file_download")

MAIN = "a" * 40
V1 = "b" * 40
REPO = "org/tiny-GGUF"


def split_model(folder: Path) -> dict[str, bytes]:
    """The tiny model written by gguf-py in 3 parts (NAME-0000i-of-00003.gguf), as llama.cpp's gguf-split does."""
    folder.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(write_tiny_model(folder / "whole.gguf"))
    writer = gguf.GGUFWriter(str(folder / "tiny-F16.gguf"), "llama", split_max_tensors=10)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = field.types[0]
        writer.add_key_value(name, field.contents(), kind, field.types[-1] if kind == gguf.GGUFValueType.ARRAY
                             else None)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {p.name: p.read_bytes() for p in sorted(folder.glob("tiny-F16-*.gguf"))}


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> dict[str, dict[str, dict[str, bytes]]]:
    """repo -> commit -> path -> bytes; the refs are in REFS."""
    parts = split_model(tmp_path_factory.mktemp("split"))
    tiny = model_bytes("llama")
    other = model_bytes("llama", (("llamaplug.variant", 1),))
    main = {"README.md": b"# tiny\n", "tiny-Q8_0.gguf": tiny, "tiny-Q4_K_M.gguf": other,
            "mmproj-tiny-F16.gguf": b"not a model", "tiny.imatrix.gguf": b"not a model either",
            **{f"split/{name}": data for name, data in parts.items()}}
    return {REPO: {MAIN: main, V1: {"tiny-Q8_0.gguf": other}},
            "org/two": {MAIN: {"a/model-Q8_0.gguf": tiny, "b/model-Q8_0.gguf": tiny, "model-Q4_0.gguf": tiny}}}


REFS = {"main": MAIN, "v1": V1}


class FakeHub:
    """The Hub's endpoints huggingface_hub uses here: /api/models/REPO[/revision/REV] and /REPO/resolve/REV/PATH."""

    def __init__(self, repos: dict[str, dict[str, dict[str, bytes]]]):
        self.repos = repos
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                outer.answer(self, body=False)

            def do_GET(self):
                outer.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def commit(self, repo: str, rev: str) -> str | None:
        sha = REFS.get(rev, rev)
        return sha if sha in self.repos.get(repo, {}) else None

    def answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        self.requests.append(f"{h.command} {h.path}")
        path = h.path.split("?", 1)[0]
        words = path.strip("/").split("/")
        if words[:2] == ["api", "models"]:
            repo = "/".join(words[2:4])
            rev = words[5] if len(words) > 5 and words[4] == "revision" else "main"
            if repo not in self.repos:
                return self.error(h, 401, "RepoNotFound")  # as the Hub: 401 for missing, private or gated
            sha = self.commit(repo, rev)
            if sha is None:
                return self.error(h, 404, "RevisionNotFound")
            files = self.repos[repo][sha]
            return self.send(h, json.dumps({"id": repo, "sha": sha, "siblings": [{"rfilename": f} for f in files]})
                             .encode(), body, {"Content-Type": "application/json"})
        if len(words) >= 5 and words[2] == "resolve":
            repo = "/".join(words[:2])
            if repo not in self.repos:
                return self.error(h, 401, "RepoNotFound")  # as the Hub: 401 for missing, private or gated
            sha = self.commit(repo, words[3])
            if sha is None:
                return self.error(h, 404, "RevisionNotFound")
            data = self.repos[repo][sha].get("/".join(words[4:]))
            if data is None:
                return self.error(h, 404, "EntryNotFound")
            return self.send(h, data, body, {"X-Repo-Commit": sha,
                                             "ETag": f'"{hashlib.sha256(data).hexdigest()}"'})
        return self.error(h, 404, None)

    @staticmethod
    def send(h: BaseHTTPRequestHandler, data: bytes, body: bool, headers: dict[str, str]) -> None:
        h.send_response(200)
        for key, value in headers.items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    @staticmethod
    def error(h: BaseHTTPRequestHandler, status: int, code: str | None) -> None:
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
        h.send_header("Content-Length", "0")
        h.end_headers()


@pytest.fixture(scope="module")
def fake_hub(repos):
    server = FakeHub(repos)
    yield server
    server.server.shutdown()


@pytest.fixture
def hub_cache(tmp_path) -> Path:
    """A cache of the test's own: what a test finds downloaded is what it downloaded (any order of tests)."""
    return tmp_path / "hf" / "hub"


@pytest.fixture
def online(monkeypatch, fake_hub, hub_cache):
    """huggingface_hub pointed at the fake endpoint and a temporary cache (as HF_ENDPOINT / HF_HUB_CACHE do)."""
    constants = hub_constants
    monkeypatch.setattr(constants, "ENDPOINT", fake_hub.url)
    monkeypatch.setattr(hub_file_download, "HUGGINGFACE_CO_URL_TEMPLATE",
                        fake_hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    fake_hub.requests.clear()
    return fake_hub


@pytest.fixture
def offline(monkeypatch, hub_cache):
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)


def test_from_pretrained_downloads_and_loads(online, repos):
    with lp.Llama.from_pretrained(REPO, filename="*Q8_0.gguf", n_ctx=64) as llama:
        path = llama.params.model_path
        assert path.name == "tiny-Q8_0.gguf" and f"snapshots/{MAIN}" in path.as_posix()
        assert path.read_bytes() == repos[REPO][MAIN]["tiny-Q8_0.gguf"]
        assert llama.create_completion("hello", max_tokens=2).text is not None
    assert any(r.startswith("GET /org/tiny-GGUF/resolve/main/tiny-Q8_0.gguf") for r in online.requests)


def test_tag_as_llama_cpp(online, repos):
    # org/repo:TAG picks the file whose name has TAG before "." or "-", case-insensitively.
    path = hub.download(REPO, tag="q4_k_m")
    assert path.name == "tiny-Q4_K_M.gguf"
    assert path.read_bytes() == repos[REPO][MAIN]["tiny-Q4_K_M.gguf"]
    assert hub.download(REPO).name == "tiny-Q4_K_M.gguf"  # no tag: Q4_K_M first, as llama.cpp


def test_revision_pinning(online, repos):
    path = hub.download(REPO, "tiny-Q8_0.gguf", revision="v1")
    assert f"snapshots/{V1}" in path.as_posix()
    assert path.read_bytes() == repos[REPO][V1]["tiny-Q8_0.gguf"] != repos[REPO][MAIN]["tiny-Q8_0.gguf"]
    with pytest.raises(lp.HubError, match="no such revision"):
        hub.download(REPO, "*.gguf", revision="v9")


def test_split_model_fetched_together(online, repos):
    with lp.Llama.from_pretrained(REPO, filename="*F16-00002-of-00003.gguf", n_ctx=64) as llama:
        first = llama.params.model_path
        assert first.name == "tiny-F16-00001-of-00003.gguf"  # any part named: every part, the first loaded
        for i in (1, 2, 3):
            part = first.with_name(f"tiny-F16-0000{i}-of-00003.gguf")
            assert part.read_bytes() == repos[REPO][MAIN][f"split/{part.name}"]
        assert llama.create_completion("hello", max_tokens=2).text is not None


def test_missing_file_lists_the_repo(online):
    with pytest.raises(lp.ModelNotFoundError, match="no file matches filename '\\*Q2_K.gguf'") as info:
        hub.download(REPO, "*Q2_K.gguf")
    for name in ("tiny-Q8_0.gguf", "tiny-Q4_K_M.gguf", "split/tiny-F16-00001-of-00003.gguf"):
        assert name in str(info.value)
    assert "README.md" not in str(info.value)
    with pytest.raises(lp.ModelNotFoundError, match="no file matches tag 'IQ1_S'"):
        hub.download(REPO, tag="IQ1_S")


def test_ambiguous_pattern_lists_the_matches(online):
    with pytest.raises(lp.InvalidParameterError, match="matches 2 models") as info:
        hub.download(REPO, "tiny-Q*.gguf")
    assert "tiny-Q8_0.gguf" in str(info.value) and "tiny-Q4_K_M.gguf" in str(info.value)
    with pytest.raises(lp.InvalidParameterError, match="a/model-Q8_0.gguf\n  b/model-Q8_0.gguf"):
        hub.download("org/two", tag="Q8_0")
    assert hub.download("org/two", "*Q4_0*").name == "model-Q4_0.gguf"


def test_missing_repository(online):
    with pytest.raises(lp.HubError, match="org/nope: no such repository"):
        hub.download("org/nope", "*.gguf")


def test_offline_uses_the_cache(online, monkeypatch):
    hub.download(REPO, "tiny-Q8_0.gguf")  # cached while online
    online.requests.clear()
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with lp.Llama.from_pretrained(REPO, filename="*q8_0.gguf", n_ctx=64) as llama:
        assert llama.params.model_path.name == "tiny-Q8_0.gguf"
    assert online.requests == []  # not one request
    with pytest.raises(lp.HubError, match="not in the local cache"):
        hub.download(REPO, "tiny-Q8_0.gguf", revision="c" * 40)


def hand_made_cache(root: Path, files: dict[str, bytes]) -> None:
    """The Hub cache layout huggingface_hub reads: blobs by hash, a snapshot of links, refs/main."""
    repo = root / "models--hand--made-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(MAIN)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / MAIN / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))


def test_hand_made_cache_offline(tmp_path, monkeypatch):
    hand_made_cache(tmp_path, {"m-Q8_0.gguf": model_bytes("llama"), "m-Q6_K.gguf": model_bytes("llama")})
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with lp.Llama.from_pretrained("hand/made-GGUF:Q6_K", cache_dir=tmp_path, n_ctx=64) as llama:
        assert llama.params.model_path.name == "m-Q6_K.gguf"
    with pytest.raises(lp.ModelNotFoundError, match="m-Q6_K.gguf\n  m-Q8_0.gguf"):
        lp.Llama.from_pretrained("hand/made-GGUF", filename="*IQ4*", cache_dir=tmp_path)
    with pytest.raises(lp.HubError, match="offline .* not in the local cache"):
        lp.Llama.from_pretrained("hand/other", filename="*.gguf", cache_dir=tmp_path)


def test_without_huggingface_hub(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as when it is not installed
    with pytest.raises(lp.HubError, match='pip install "llamaplug\\[hub\\]"'):
        lp.Llama.from_pretrained(REPO, filename="*.gguf")


def test_cli_model_argument(online, tmp_path, monkeypatch):
    from llamaplug.cli import model_path

    assert Path(model_path(f"{REPO}:Q8_0")).name == "tiny-Q8_0.gguf"  # -m org/repo:TAG
    assert model_path("models/local.gguf") == "models/local.gguf"  # a path, even a missing one, stays a path
    monkeypatch.chdir(tmp_path)
    Path("org").mkdir()
    Path("org/repo").write_bytes(b"x")
    assert model_path("org/repo") == "org/repo"  # an existing relative path wins over a repository id


def test_cli_run_repo_tag(fake_hub, tmp_path):
    # The user's path: HF_ENDPOINT and HF_HOME in the environment, `llamaplug run org/repo:TAG PROMPT`.
    env = {**os.environ, "HF_ENDPOINT": fake_hub.url, "HF_HOME": str(tmp_path), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    run = subprocess.run([sys.executable, "-m", "llamaplug.cli", "run", f"{REPO}:Q8_0", "hello", "-n", "2",
                          "--temp", "0", "-c", "64", "-t", "2"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("hello")
    assert (tmp_path / "hub" / "models--org--tiny-GGUF" / "snapshots" / MAIN / "tiny-Q8_0.gguf").is_file()
    env["HF_HUB_OFFLINE"] = "1"
    run = subprocess.run([sys.executable, "-m", "llamaplug.cli", "run", f"{REPO}:Q2_K", "hello"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "no file matches tag 'Q2_K'" in run.stderr and "tiny-Q8_0.gguf" in run.stderr
