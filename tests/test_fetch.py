"""vendor/llama.cpp/fetch.py's extraction of the pinned sdist, with and without tarfile's "data" filter.

Pythons before 3.11.4 / 3.10.12 (Debian 12's system 3.11.2) have no `filter` argument: a fresh machine's
`make run` with that Python failed there. Pure Python: no native code involved.
"""

from __future__ import annotations

import importlib.util
import io
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fetch():
    spec = importlib.util.spec_from_file_location("llamaplug_fetch", ROOT / "vendor" / "llama.cpp" / "fetch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def archive(tmp_path: Path, *members: tuple[str, str | None, str | None]) -> tarfile.TarFile:
    """A tar of (name, file text or None, symlink target or None) members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                data = (text or "").encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return tarfile.open(fileobj=buf)


@pytest.mark.parametrize("has_filter", [True, False], ids=["filter", "no-filter"])
def test_a_tree_is_extracted_with_or_without_the_data_filter(fetch, tmp_path, monkeypatch, has_filter):
    if not has_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    with archive(tmp_path, ("src/llama.cpp", "int x;", None), ("include/llama.h", "#pragma once", None),
                 ("link.h", None, "include/llama.h")) as tar:
        fetch.extract(tar, tmp_path, tar.getmembers())
    assert (tmp_path / "src" / "llama.cpp").read_text() == "int x;"
    assert (tmp_path / "link.h").read_text() == "#pragma once"


@pytest.mark.parametrize("member", [("../evil.txt", "x", None), ("/tmp/evil.txt", "x", None),
                                    ("inner/out", None, "../../outside")],
                         ids=["dot-dot", "absolute", "escaping-symlink"])
def test_without_the_filter_a_member_outside_the_tree_is_refused(fetch, tmp_path, monkeypatch, member):
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    dest = tmp_path / "tree"
    dest.mkdir()
    with archive(tmp_path, ("ok.txt", "fine", None), member) as tar, pytest.raises(fetch.FetchError,
                                                                                  match="outside the tree"):
        fetch.extract(tar, dest, tar.getmembers())
    assert not (tmp_path / "evil.txt").exists() and not list(dest.iterdir())  # nothing written
