"""GGUF models from the Hugging Face Hub, through `huggingface_hub` (pip install "llamaplug[hub]").

Its cache, progress bars, token, HF_ENDPOINT and HF_HUB_OFFLINE all apply. A file is chosen by a
glob (`filename="*Q4_K_M.gguf"`) or by a quantization tag as llama.cpp's `-hf org/repo:TAG` does
(the tag followed by "." or "-" in the name, case-insensitive; no tag: Q4_K_M, then Q8_0, then the
first model file). A split model (`NAME-00001-of-00003.gguf`) is one choice: every part is
downloaded and the first part's path returned (llama.cpp opens the others).

`download(..., progress=fn)` reports each file's bytes as they arrive (the partial file in the
cache, watched), for `llamaplug pull` and Ollama's /api/pull; `cached_models` and `remove_cached`
list and delete the models in the cache (`llamaplug list` / `rm`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import HubError, InvalidParameterError, ModelNotFoundError

log = logging.getLogger("llamaplug.hub")

# A split GGUF's file name (llama.cpp's llama_split_prefix): PREFIX-00001-of-00003.gguf (model_card.py reads it too).
SPLIT_GGUF = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# Files of a GGUF repository that are not a model to run (llama.cpp's gguf_filename_is_model).
_NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
_REF = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?::(?P<tag>[\w.-]+))?$")


def parse_ref(text: str) -> tuple[str, str | None] | None:
    """("org/repo", "TAG" or None) for "org/repo[:TAG]", or None when `text` is not that shape."""
    found = _REF.match(text)
    return (found["repo"], found["tag"]) if found else None


def _hub() -> Any:
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.errors  # noqa: F401 - submodules: the package loads its names lazily
    except ImportError:
        raise HubError('loading models from the Hugging Face Hub needs huggingface_hub: '
                       'pip install "llamaplug[hub]"') from None
    return huggingface_hub


def _offline(hub: Any) -> bool:
    return bool(hub.constants.HF_HUB_OFFLINE)


def cached_files(repo_id: str, revision: str | None = None, cache_dir: str | os.PathLike[str] | None = None
                 ) -> list[str] | None:
    """The files of `repo_id` at `revision` (a branch, tag or commit) in the local hub cache, or None if that
    revision is not cached."""
    snapshot = cached_snapshot(repo_id, revision, cache_dir)
    if snapshot is None:
        return None
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())


def cached_snapshot(repo_id: str, revision: str | None = None, cache_dir: str | os.PathLike[str] | None = None
                    ) -> Path | None:
    """The folder of `repo_id` at `revision` (default main) in the local hub cache, or None if not cached."""
    hub = _hub()
    repo = _repo_folder(hub, repo_id, cache_dir)
    rev = revision or "main"
    ref = repo / "refs" / rev
    commit = ref.read_text().strip() if ref.is_file() else rev
    snapshot = repo / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def repo_files(repo_id: str, revision: str | None = None, cache_dir: str | os.PathLike[str] | None = None,
               endpoint: str | None = None) -> list[str]:
    """Every file of the repository at `revision`: asked of the Hub, or read from the cache when offline
    (HF_HUB_OFFLINE=1) or when the Hub cannot be reached."""
    return _listing(repo_id, revision, cache_dir, endpoint)[0]


def _listing(repo_id: str, revision: str | None, cache_dir: str | os.PathLike[str] | None, endpoint: str | None
             ) -> tuple[list[str], bool]:
    """repo_files, and whether they come from the cache alone (offline, or the Hub unreachable)."""
    hub = _hub()
    errors = hub.errors
    where = f"{repo_id}" + (f"@{revision}" if revision else "")
    unreachable = None
    if not _offline(hub):
        try:
            info = hub.HfApi(endpoint=endpoint).model_info(repo_id, revision=revision)
            return sorted(s.rfilename for s in info.siblings or ()), False
        except errors.HFValidationError as exc:
            raise InvalidParameterError(f"{repo_id!r} is not a Hub repository id: {exc}", field="repo_id") from None
        except errors.RevisionNotFoundError:
            raise HubError(f"{where}: no such revision on the Hugging Face Hub") from None
        except errors.RepositoryNotFoundError:
            raise HubError(f"{where}: no such repository on the Hugging Face Hub (or it is private or gated: "
                           f"log in with `hf auth login` or set HF_TOKEN)") from None
        except (errors.HfHubHTTPError, OSError) as exc:  # no network, a proxy, a 5xx: as llama.cpp, try the cache
            unreachable = reason(exc, endpoint or hub.constants.ENDPOINT)
    files = cached_files(repo_id, revision, cache_dir)
    if files is None:
        why = "offline (HF_HUB_OFFLINE=1)" if _offline(hub) else f"the Hub could not be reached ({unreachable})"
        raise HubError(f"{where}: {why} and this revision is not in the local cache "
                       f"({cache_dir or hub.constants.HF_HUB_CACHE})")
    if unreachable is not None:
        log.warning("cannot list %s on the Hub (%s): using the local cache", where, unreachable)
    return files, True


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^\"')\\]+)")


def reason(exc: BaseException, endpoint: str) -> str:
    """Why the Hub could not be reached, in a few words: the socket's own reason ("Connection refused", "Name or
    service not known") rather than urllib3's MaxRetryError with its pool, URL and request id."""
    found = _ERRNO.search(str(exc))
    if found is not None:
        return f"{endpoint}: {found[1].strip()}"
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{endpoint}: {first[:200]}"


def _is_model(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.lower().endswith(".gguf") and not any(word in name for word in _NOT_MODELS)


def _choices(paths: list[str]) -> dict[str, list[str]]:
    """Model files grouped into choices: a split model's parts are one choice, named by its first part."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        found = SPLIT_GGUF.match(path)
        if found is None:
            groups[path] = [path]
            continue
        first = f"{found['prefix']}-00001-of-{found['count']}.gguf"
        groups.setdefault(first, []).append(path)
    return {first: sorted(parts) for first, parts in groups.items()}


def _by_glob(files: list[str], pattern: str) -> list[str]:
    low = pattern.lower()
    return [f for f in files
            if fnmatch.fnmatchcase(f.lower(), low) or fnmatch.fnmatchcase(f.rsplit("/", 1)[-1].lower(), low)]


def _by_tag(files: list[str], tag: str) -> list[str]:
    wanted = re.compile(re.escape(tag) + r"[.-]", re.IGNORECASE)
    return [f for f in files if _is_model(f) and wanted.search(f)]


def pick(files: list[str], repo_id: str, filename: str | None = None, tag: str | None = None) -> list[str]:
    """The file(s) to download for one model: [path], or a split model's parts, first part first.

    `filename` is a glob over the repository's paths (or their base names); `tag` a quantization tag.
    No match: ModelNotFoundError listing the repository's .gguf files; several models: an
    InvalidParameterError listing them.
    """
    if filename is not None and tag is not None:
        raise InvalidParameterError("give a filename pattern or a tag, not both", field="filename")
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    if filename is not None:
        matched = _by_glob(files, filename)
        asked = f"filename {filename!r}"
    elif tag is not None:
        matched = _by_tag(files, tag)
        asked = f"tag {tag!r}"
    else:
        asked = "a model (tags " + ", ".join(DEFAULT_TAGS) + " or any)"
        matched = next((m for m in (_by_tag(files, t) for t in DEFAULT_TAGS) if m), [])
        if not matched:  # the first model file (a split model's first part)
            firsts = [f for f in files if _is_model(f) and (SPLIT_GGUF.match(f) is None or
                                                                int(SPLIT_GGUF.match(f)["index"]) == 1)]
            matched = firsts[:1]
    split_parts = _choices(ggufs)
    chosen: dict[str, list[str]] = {}
    for path in matched:
        found = SPLIT_GGUF.match(path)
        first = f"{found['prefix']}-00001-of-{found['count']}.gguf" if found else path
        chosen[first] = split_parts.get(first, [path])
    listing = "\n  ".join(ggufs) if ggufs else "(none)"
    if not chosen:
        raise ModelNotFoundError(f"{repo_id}: no file matches {asked}; its .gguf files:\n  {listing}")
    if len(chosen) > 1:
        raise InvalidParameterError(f"{repo_id}: {asked} matches {len(chosen)} models, say which:\n  "
                                    + "\n  ".join(chosen), field="filename")
    first, parts = next(iter(chosen.items()))
    found = SPLIT_GGUF.match(first)
    if found is not None:
        count = int(found["count"])
        expected = [f"{found['prefix']}-{i:05d}-of-{found['count']}.gguf" for i in range(1, count + 1)]
        missing = [p for p in expected if p not in parts]
        if missing:
            raise ModelNotFoundError(f"{repo_id}: split model {first} lacks parts: {', '.join(missing)}")
        parts = expected
    return parts


@dataclasses.dataclass(frozen=True)
class Progress:
    """How far the download of one file is: `completed` of `total` bytes (0: not known yet)."""

    file: str  # its path in the repository
    digest: str  # the Hub's etag of it: its sha256 for a large (LFS) file; "" when not known
    completed: int
    total: int


ProgressFn = Callable[[Progress], None]
_POLL = 0.25  # seconds between two looks at a partial download


def download(repo_id: str, filename: str | None = None, *, tag: str | None = None, revision: str | None = None,
             cache_dir: str | os.PathLike[str] | None = None, endpoint: str | None = None,
             progress: ProgressFn | None = None) -> Path:
    """Download (or find in the cache) one model of `repo_id` and return the local path of its (first) file.

    `progress`, if given, is called (from this thread and a watcher thread) as each file's bytes arrive.
    """
    hub = _hub()
    files, cache_only = _listing(repo_id, revision, cache_dir, endpoint)
    parts = pick(files, repo_id, filename, tag)
    errors = hub.errors
    paths = []
    for part in parts:
        try:
            # A Hub found unreachable is not asked again per file: huggingface_hub's HEAD would retry five times
            # (23 s of backoff, each retry a MaxRetryError warning) before it too falls back on the cache.
            if progress is None:
                paths.append(Path(hub.hf_hub_download(repo_id, part, revision=revision, cache_dir=cache_dir,
                                                      endpoint=endpoint, local_files_only=cache_only)))
            else:
                paths.append(_download_reporting(hub, repo_id, part, revision, cache_dir, endpoint, progress,
                                                 cache_only))
        except errors.LocalEntryNotFoundError:
            raise HubError(f"{repo_id}: {part} is not in the local cache and the Hub cannot be used "
                           f"(offline, or unreachable)") from None
        except (errors.HfHubHTTPError, OSError) as exc:
            raise HubError(f"{repo_id}: downloading {part} failed: {reason(exc, endpoint or hub.constants.ENDPOINT)}"
                           ) from None
    return paths[0]


def _download_reporting(hub: Any, repo_id: str, part: str, revision: str | None,
                        cache_dir: str | os.PathLike[str] | None, endpoint: str | None, progress: ProgressFn,
                        cache_only: bool) -> Path:
    """hf_hub_download of one file, its partial blob (blobs/ETAG.incomplete) watched meanwhile for `progress`."""
    cached = hub.try_to_load_from_cache(repo_id, part, cache_dir=cache_dir, revision=revision)
    if isinstance(cached, str) or cache_only:
        path = Path(hub.hf_hub_download(repo_id, part, revision=revision, cache_dir=cache_dir, endpoint=endpoint,
                                        local_files_only=cache_only))
        size = path.stat().st_size
        progress(Progress(part, path.resolve().name, size, size))
        return path
    meta = hub.get_hf_file_metadata(hub.hf_hub_url(repo_id, part, revision=revision, endpoint=endpoint))
    etag, total = meta.etag or "", meta.size or 0
    partial = _repo_folder(hub, repo_id, cache_dir) / "blobs" / f"{etag}.incomplete"
    progress(Progress(part, etag, 0, total))
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(_POLL):
            try:
                progress(Progress(part, etag, partial.stat().st_size, total))
            except FileNotFoundError:
                pass

    watcher = threading.Thread(target=watch, name="llamaplug-hub-progress", daemon=True)
    watcher.start()
    try:
        path = Path(hub.hf_hub_download(repo_id, part, revision=revision, cache_dir=cache_dir, endpoint=endpoint))
    finally:
        stop.set()
        watcher.join()
    size = path.stat().st_size
    progress(Progress(part, etag or path.resolve().name, size, total or size))
    return path


def _repo_folder(hub: Any, repo_id: str, cache_dir: str | os.PathLike[str] | None) -> Path:
    root = Path(cache_dir if cache_dir is not None else hub.constants.HF_HUB_CACHE)
    return root / ("models--" + repo_id.replace("/", "--"))


@dataclasses.dataclass(frozen=True)
class CachedModel:
    """One model file in the Hub's cache (a split model: its first part)."""

    repo_id: str
    file: str  # its path in the repository
    path: Path  # in the snapshot (a link to its blob)
    revision: str  # the snapshot's commit
    tag: str | None  # the quantization tag that picks it ("org/repo:TAG"), None where no tag alone does
    size: int  # bytes, every part
    modified: float  # when it was downloaded (the blob's modification time)

    @property
    def name(self) -> str:
        return f"{self.repo_id}:{self.tag}" if self.tag else f"{self.repo_id}/{self.file}"


def cached_models(cache_dir: str | os.PathLike[str] | None = None) -> list[CachedModel]:
    """The GGUF models in the Hub's cache, by repository and file (mmproj, imatrix files excepted)."""
    hub = _hub()
    root = Path(cache_dir if cache_dir is not None else hub.constants.HF_HUB_CACHE)
    found: list[CachedModel] = []
    for repo in sorted(root.glob("models--*--*")):
        repo_id = repo.name.removeprefix("models--").replace("--", "/", 1)
        for snapshot in sorted((repo / "snapshots").glob("*")):
            files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
            for first, parts in _choices([f for f in files if _is_model(f)]).items():
                path = snapshot / first
                found.append(CachedModel(repo_id, first, path, snapshot.name, _tag_of(files, repo_id, first),
                                         sum((snapshot / p).stat().st_size for p in parts),
                                         path.resolve().stat().st_mtime))
    return found


def _tag_of(files: list[str], repo_id: str, first: str) -> str | None:
    """The shortest tail of `first`'s name ("Q8_0", "Instruct-Q8_0") that picks it alone, as `pick` picks by tag."""
    name = first.rsplit("/", 1)[-1]
    split = SPLIT_GGUF.match(name)
    words = (split["prefix"] if split else name.removesuffix(".gguf")).split("-")
    for k in range(1, len(words)):
        tag = "-".join(words[-k:])
        try:
            if pick(files, repo_id, tag=tag)[0] == first:
                return tag
        except (InvalidParameterError, ModelNotFoundError):
            continue
    return None


def remove_cached(repo_id: str, tag: str | None = None, cache_dir: str | os.PathLike[str] | None = None
                  ) -> list[Path]:
    """Delete from the Hub's cache the model `tag` picks in `repo_id` (every snapshot of it), or with no tag the
    whole repository. Returns the snapshot paths removed; ModelNotFoundError if there is nothing to remove."""
    hub = _hub()
    folder = _repo_folder(hub, repo_id, cache_dir)
    if tag is None:
        if not folder.is_dir():
            raise ModelNotFoundError(f"{repo_id} is not in the Hub cache ({folder.parent})")
        removed = [p for p in (folder / "snapshots").rglob("*") if p.is_file()]
        shutil.rmtree(folder)
        return removed
    links: list[Path] = []
    for snapshot in sorted((folder / "snapshots").glob("*")):
        files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
        try:
            links += [snapshot / part for part in pick(files, repo_id, tag=tag)]
        except ModelNotFoundError:
            continue
    if not links:
        raise ModelNotFoundError(f"{repo_id}:{tag} is not in the Hub cache ({folder.parent})")
    blobs = {link.resolve() for link in links}
    for link in links:
        link.unlink()
    # A blob goes once no snapshot links to it any more (another revision may share it).
    still = {p.resolve() for p in (folder / "snapshots").rglob("*") if p.is_file()}
    for blob in blobs - still:
        if blob.parent.name == "blobs":
            blob.unlink(missing_ok=True)
    if not still:  # its last file gone: the repository goes too, as `rm` of the whole repository does
        shutil.rmtree(folder)
    return links
