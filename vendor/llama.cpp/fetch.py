#!/usr/bin/env python3
"""Materialise the pinned llama.cpp tree and print its path.

The tree is never committed: it comes from the registry's source distribution
named in PIN (which vendors exactly the pinned upstream commit), is verified
against the sha256 in PIN, and is unpacked once into a cache directory, where
llamaplug's own patches (patches/*.patch, `patch -p1`, in name order) are applied.
The directory's name carries a short hash of the patch set, so changing the patches
materialises a fresh tree. LLAMAPLUG_LLAMA_CPP_DIR points at an existing checkout
instead (used as it is: the patches are not applied to it).

Usage: fetch.py            -> prints the tree's path (materialising it if needed)
       fetch.py --pin KEY  -> prints one value of PIN
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATCHES = HERE / "patches"


class FetchError(Exception):
    pass


def read_pin() -> dict[str, str]:
    pin = {}
    for line in (HERE / "PIN").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            pin[key.strip()] = value.strip()
    return pin


def cache_root() -> Path:
    base = os.environ.get("LLAMAPLUG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llamaplug"
    )
    return Path(base)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_sdist(pin: dict[str, str], dest: Path) -> Path:
    target = dest / pin["sdist_file"]
    if target.exists():
        return target
    dest.mkdir(parents=True, exist_ok=True)
    # pip knows the configured index (and its mirrors); --no-build-isolation keeps
    # pip from building the peer's build requirements just to read its metadata.
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
        "--no-binary", pin["sdist"].split("==")[0], pin["sdist"], "-d", str(dest),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0 or not target.exists():
        raise FetchError(
            f"could not download {pin['sdist']} (the pinned llama.cpp source):\n{result.stderr[-2000:]}"
        )
    return target


def verify(path: Path, expected: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        path.unlink()
        raise FetchError(
            f"sha256 mismatch for {path.name}: expected {expected}, got {actual}; "
            "the file was removed, run again to re-download"
        )


def check_tree(tree: Path) -> None:
    for needed in ("CMakeLists.txt", "include/llama.h", "ggml/include/ggml-backend.h", "src/llama.cpp"):
        if not (tree / needed).is_file():
            raise FetchError(f"llama.cpp tree at {tree} lacks {needed}")


def patch_files() -> list[Path]:
    return sorted(PATCHES.glob("*.patch")) if PATCHES.is_dir() else []


def patches_id() -> str:
    """A short hash of the patch set ("" when there are none): part of the tree's directory name."""
    files = patch_files()
    if not files:
        return ""
    digest = hashlib.sha256()
    for patch in files:
        digest.update(patch.name.encode() + b"\0" + patch.read_bytes() + b"\0")
    return digest.hexdigest()[:10]


def apply_patches(tree: Path) -> None:
    files = patch_files()
    if files and not shutil.which("patch"):
        raise FetchError("the `patch` program is needed to apply vendor/llama.cpp/patches (apt-get install patch)")
    for patch in files:
        cmd = ["patch", "-p1", "-N", "-s", "--no-backup-if-mismatch", "-d", str(tree), "-i", str(patch)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise FetchError(f"{patch.name} does not apply to the pinned tree:\n{(done.stdout + done.stderr)[-2000:]}")


def tree_dir(pin: dict[str, str]) -> Path:
    """Where the pinned tree (with this patch set applied) is materialised."""
    suffix = patches_id()
    return cache_root() / (f"llama.cpp-{pin['commit']}" + (f"-p{suffix}" if suffix else ""))


def extract(tar: tarfile.TarFile, dest: Path, members: list[tarfile.TarInfo]) -> None:
    """`members` into `dest`, refusing any that would land outside it (tarfile's "data" filter).

    Pythons before 3.11.4 / 3.10.12 (Debian 12's 3.11.2) have no `filter` argument: the same rules are
    checked here instead, so the build works with the system Python the install page allows.
    """
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, members=members, filter="data")
        return
    root = dest.resolve()
    for member in members:
        target = (root / member.name).resolve()
        link = (target.parent / member.linkname).resolve() if member.issym() else (
            (root / member.linkname).resolve() if member.islnk() else target)
        if (Path(member.name).is_absolute() or not target.is_relative_to(root) or not link.is_relative_to(root)
                or not (member.isfile() or member.isdir() or member.issym() or member.islnk())):
            raise FetchError(f"the sdist's member {member.name!r} would land outside the tree (or is not a file)")
    tar.extractall(dest, members=members)


def materialise() -> Path:
    override = os.environ.get("LLAMAPLUG_LLAMA_CPP_DIR")
    if override:
        tree = Path(override).expanduser().resolve()
        check_tree(tree)
        return tree
    pin = read_pin()
    tree = tree_dir(pin)
    if (tree / ".llamaplug-complete").exists():
        return tree
    sdist = download_sdist(pin, cache_root() / "sdist")
    verify(sdist, pin["sdist_sha256"])
    prefix = pin["sdist_subdir"].rstrip("/") + "/"
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp, tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise FetchError(f"{sdist.name} has no {prefix}")
        for member in members:
            member.name = member.name[len(prefix):]
        extract(tar, Path(tmp), [m for m in members if m.name])
        staged = Path(tmp)
        (staged / ".git").unlink(missing_ok=True)  # a gitlink into the sdist's own .git
        check_tree(staged)
        apply_patches(staged)
        (staged / ".llamaplug-complete").write_text(
            pin["commit"] + "\n" + "".join(f"{p.name}\n" for p in patch_files()))
        if tree.exists():
            shutil.rmtree(tree)
        staged.rename(tree)
        staged.mkdir()  # TemporaryDirectory wants something to remove
    return tree


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["--pin"]:
            print(read_pin()[argv[1]])
        else:
            print(materialise())
    except (FetchError, KeyError) as exc:
        print(f"llamaplug: pinned llama.cpp: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
