"""The prompt cache's disk tier: KV of token sequences kept in files, read again after a restart.

Under the RAM tier (prefix_store.py): `TieredStore` is a PrefixStore whose evicted entries, long
prompts just read (`PREFILL_WRITE` tokens or more decoded by the prefill itself) and, at a clean
close, every slot's sequence and RAM entry go to the `DiskStore`; a prompt whose longest cached
prefix is on disk only is loaded from there instead of being read again.

A file <name>.kv (name: 64 hex digits, nothing else is ever written but `tmp-<hex>` and `lock`):

    MAGIC | u32 header length | header (JSON: llama.cpp pin, scope, its description, n_tokens, kv_bytes)
    | tokens (int32 LE) | KV bytes (LlamaContext.state_seq_get) | sha256 of everything before (32 bytes)

Names: the scope (cache_scope.py: the model's identity and every setting that changes KV) seeds a
hash chain over blocks of `BLOCK` tokens (vLLM's prefix caching); the name hashes the chain's end
with the tokens left over. The index maps each block's chain hash to the files that hold it, so a
prompt finds the file sharing its longest beginning; the tokens in the file say how long exactly.

Safety: a write is a temporary file renamed over (os.replace), under an flock of `lock` that also
covers the eviction (oldest mtime first; a hit touches its file), so the directory never holds more
than the limit, whichever process writes (a store opening on a directory filled under a larger limit
evicts down to its own at once). A file that is truncated, fails its checksum, is not what
its name says, comes from another llama.cpp pin, or is refused by the context is skipped with one
warning and removed; other scopes' files (another model sharing the directory) are left alone and
never read; a file another process removed is a plain miss.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import queue
import re
import secrets
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._version import LLAMA_CPP_COMMIT
from ..errors import InvalidParameterError
from .cache_scope import describe, scope_digest
from .prefix_store import PrefixStore, common_prefix

if TYPE_CHECKING:
    from ..blocks.context import LlamaContext
    from .stats import EngineStats

log = logging.getLogger("llamaplug.cache")

MAGIC = b"LPKVC\x001\n"
BLOCK = 64  # tokens per hashed block; a shorter sequence is never written (cheap to read again)
PREFILL_WRITE = 512  # a prefill that decoded this many tokens writes the prompt's KV at once
DEFAULT_DISK_MIB = 4096
_HEAD = struct.Struct("<8sI")
_DIGEST = 32
_NAME = re.compile(r"[0-9a-f]{64}\.kv")
_TMP = re.compile(r"tmp-[0-9a-f]{16}")
_STALE_TMP = 600.0  # a temporary file this old was left by a writer that died
_PENDING_MAX = 512 << 20  # KV bytes queued for the writer thread at most; more are dropped


def chain(scope: str, tokens: Sequence[int]) -> tuple[list[bytes], bytes]:
    """The chain hash after each full block of `tokens`, and the name digest of the whole sequence."""
    arr = np.asarray(tokens, dtype="<i4")
    h = hashlib.sha256(scope.encode()).digest()
    blocks = []
    n_full = len(arr) // BLOCK
    for i in range(n_full):
        h = hashlib.sha256(h + arr[i * BLOCK:(i + 1) * BLOCK].tobytes()).digest()
        blocks.append(h)
    name = hashlib.sha256(h + arr[n_full * BLOCK:].tobytes() + len(arr).to_bytes(8, "little")).digest()
    return blocks, name


def file_name(scope: str, tokens: Sequence[int]) -> str:
    return chain(scope, tokens)[1].hex()


@dataclass
class FileHead:
    """What a cache file's header says (`read_head`), and where its parts start."""

    llama_cpp: str
    scope: str
    description: dict[str, Any]
    tokens: tuple[int, ...]
    kv_bytes: int
    kv_start: int
    size: int


class BadFile(Exception):
    """Why a cache file cannot be used."""


def _parse_head(raw: bytes, size: int) -> tuple[str, str, dict[str, Any], int, int, int]:
    """(llama_cpp, scope, description, n_tokens, kv_bytes, where the tokens start) from a file's first bytes."""
    if len(raw) < _HEAD.size:
        raise BadFile(f"truncated ({size} bytes)")
    magic, n_head = _HEAD.unpack_from(raw)
    if magic != MAGIC:
        raise BadFile("not a llamaplug cache file (magic)")
    if _HEAD.size + n_head > min(size, len(raw)):
        raise BadFile(f"header of {n_head} bytes in a file of {size}")
    try:
        head = json.loads(bytes(raw[_HEAD.size:_HEAD.size + n_head]))
        n_tokens, kv_bytes = int(head["n_tokens"]), int(head["kv_bytes"])
        llama_cpp, scope, description = str(head["llama_cpp"]), str(head["scope"]), dict(head["description"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadFile(f"unreadable header ({exc})") from None
    start = _HEAD.size + n_head
    if n_tokens < 1 or kv_bytes < 1 or start + 4 * n_tokens + kv_bytes + _DIGEST != size:
        raise BadFile(f"truncated or padded: {size} bytes, its header says {start + 4 * n_tokens + kv_bytes + _DIGEST}")
    return llama_cpp, scope, description, n_tokens, kv_bytes, start


def _head(raw: bytes, size: int, tokens: bytes | memoryview) -> FileHead:
    llama_cpp, scope, description, n_tokens, kv_bytes, start = _parse_head(raw, size)
    arr = np.frombuffer(tokens, dtype="<i4", count=n_tokens, offset=start if len(tokens) == size else 0)
    return FileHead(llama_cpp, scope, description, tuple(arr.tolist()), kv_bytes, start + 4 * n_tokens, size)


def read_head(path: Path) -> FileHead:
    """The header and tokens of a cache file (its KV and checksum unread); BadFile if they do not hold together."""
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        raw = fh.read(_HEAD.size)
        if len(raw) == _HEAD.size:
            raw += fh.read(min(_HEAD.unpack(raw)[1], 1 << 20))
        n_tokens = _parse_head(raw, size)[3]
        return _head(raw, size, fh.read(4 * n_tokens))


def head_of(raw: bytes | memoryview) -> FileHead:
    """read_head over a whole file read already (it may be gone from the directory by now)."""
    return _head(bytes(raw[:_HEAD.size + min(len(raw), 1 << 20)]), len(raw), raw)


def encode(scope: str, description: dict[str, Any], tokens: Sequence[int], data: bytes) -> list[bytes]:
    """A cache file's bytes, in parts (the last: the checksum)."""
    head = json.dumps({"llama_cpp": LLAMA_CPP_COMMIT, "scope": scope, "description": description,
                       "n_tokens": len(tokens), "kv_bytes": len(data)}).encode()
    parts = [_HEAD.pack(MAGIC, len(head)), head, np.asarray(tokens, dtype="<i4").tobytes(), data]
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return [*parts, h.digest()]


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    blocks: list[bytes]
    size: int


class DiskStore:
    """Cache files in `directory`, at most `limit` bytes in all (every process on it keeping the same limit)."""

    def __init__(self, directory: str | os.PathLike[str], limit: int, context: LlamaContext):
        self.dir = Path(directory)
        self.limit = limit
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "lock").touch()
        except OSError as exc:
            raise InvalidParameterError(f"cannot use {self.dir} as a cache directory: {exc.strerror}",
                                        field="cache_dir") from None
        self._ctx = context
        self._lock = threading.RLock()  # the index: the engine's worker reads it, the writer thread adds
        self._entries: dict[str, _Entry] = {}
        self._by_block: dict[bytes, set[str]] = {}
        self._others: set[str] = set()  # other scopes' files, known not to be ours
        self._dir_mtime = -1
        self._memo: tuple[tuple[Any, ...], str, dict[str, Any]] | None = None
        self._cvec: Any = None
        self._queue: queue.Queue[tuple[str, dict[str, Any], tuple[int, ...], bytes] | None] = queue.Queue()
        self._pending: dict[str, int] = {}  # name -> KV bytes waiting for the writer
        self._writer: threading.Thread | None = None
        self._closed = False
        self.stats: EngineStats | None = None  # cache_disk_bytes kept here when set
        with self._dir_locked():  # a directory filled under a larger limit (another run's) is brought under ours
            self._make_room(0)

    # -- the scope ----------------------------------------------------------------
    def scope(self) -> tuple[str, dict[str, Any]]:
        """The context's scope now (adapters may have changed since the last call: then the index is redone)."""
        ctx = self._ctx
        cvec = ctx.control_vector
        # the objects themselves, not their ids (an id may come back for the next vector once the last is freed)
        memo = (tuple(ctx.loras.items()), None if cvec is None else cvec[1:])
        if self._memo is None or self._memo[0] != memo or self._cvec is not (None if cvec is None else cvec[0]):
            self._cvec = None if cvec is None else cvec[0]
            description = describe(ctx)
            digest = scope_digest(description)
            with self._lock:
                if self._memo is None or self._memo[1] != digest:
                    self._entries.clear()
                    self._by_block.clear()
                    self._others.clear()
                    self._dir_mtime = -1
                self._memo = (memo, digest, description)
        assert self._memo is not None
        return self._memo[1], self._memo[2]

    # -- the index ----------------------------------------------------------------
    def _refresh(self, scope: str) -> None:
        """Index the files added since the last look (another process's too); forget the ones gone."""
        try:
            mtime = os.stat(self.dir).st_mtime_ns
        except OSError:
            return
        if mtime == self._dir_mtime:
            return
        now = time.time()
        # a change within the timestamp's tick of this look would not move the mtime again: look next time too
        self._dir_mtime = mtime if now - mtime / 1e9 > 0.05 else -1
        seen = set()
        try:
            listing = list(os.scandir(self.dir))
        except OSError:
            return
        for item in listing:
            if _TMP.fullmatch(item.name):
                with contextlib.suppress(OSError):
                    if now - item.stat().st_mtime > _STALE_TMP:
                        os.unlink(item.path)
                continue
            if not _NAME.fullmatch(item.name):
                continue
            name = item.name[:-3]
            seen.add(name)
            if name not in self._entries and name not in self._others:
                self._index(name, scope)
        for gone in set(self._entries) - seen:
            self._forget(gone)
        self._others &= seen
        self._note_usage()

    def _note_usage(self) -> None:
        if self.stats is not None:
            self.stats.cache_disk_bytes = disk_usage(self.dir)

    def _index(self, name: str, scope: str) -> None:
        path = self.dir / f"{name}.kv"
        try:
            head = read_head(path)
            blocks, digest = chain(head.scope, head.tokens)
            if digest.hex() != name:
                raise BadFile("its name is not its contents' (written for other settings, or damaged)")
            if head.scope == scope and head.llama_cpp != LLAMA_CPP_COMMIT:
                raise BadFile(f"written by llama.cpp {head.llama_cpp}, this is {LLAMA_CPP_COMMIT}")
        except FileNotFoundError:
            return
        except (OSError, BadFile) as exc:
            self._discard(path, str(exc))
            return
        if head.scope != scope:
            self._others.add(name)
            return
        self._add(name, head.tokens, head.size, blocks)

    def _add(self, name: str, tokens: tuple[int, ...], size: int, blocks: list[bytes]) -> None:
        self._entries[name] = _Entry(tokens, blocks, size)
        for b in blocks:
            self._by_block.setdefault(b, set()).add(name)

    def _forget(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        for b in entry.blocks:
            names = self._by_block.get(b)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_block[b]

    def _discard(self, path: Path, why: str) -> None:
        log.warning("prompt cache: skipping and removing %s: %s", path, why)
        with contextlib.suppress(OSError):
            os.unlink(path)
        self._forget(path.name[:-3])

    def best(self, prompt: Sequence[int]) -> tuple[tuple[int, ...], int, str] | None:
        """The file sharing the longest beginning with `prompt`: (its tokens, that length, its name); None: none."""
        if len(prompt) < BLOCK or min(prompt) < 0:
            return None
        scope, _ = self.scope()
        blocks, _ = chain(scope, prompt)
        with self._lock:
            self._refresh(scope)
            names: set[str] = set()
            for b in blocks:
                found = self._by_block.get(b)
                if not found:
                    break
                names = found
            best: tuple[tuple[int, ...], int, str] | None = None
            for name in names:
                tokens = self._entries[name].tokens
                n = common_prefix(tokens, prompt)
                if best is None or n > best[1]:
                    best = tokens, n, name
        return best

    def covers(self, tokens: Sequence[int]) -> bool:
        """Whether a file (or a write on its way) holds `tokens` (itself or a longer sequence starting with them)."""
        scope, _ = self.scope()
        blocks, name = chain(scope, tokens)
        with self._lock:
            if name.hex() in self._pending or name.hex() in self._entries:
                return True
            if not blocks:
                return False
            n = len(tokens)
            return any(len(self._entries[other].tokens) >= n and common_prefix(self._entries[other].tokens, tokens) == n
                       for other in self._by_block.get(blocks[-1], ()))

    # -- reading ------------------------------------------------------------------
    def load(self, name: str, tokens: tuple[int, ...]) -> memoryview | None:
        """The KV bytes of file `name` (holding `tokens`), checked; None (a warning where the file was bad)."""
        path = self.dir / f"{name}.kv"
        scope, _ = self.scope()
        with self._lock:
            try:
                raw = path.read_bytes()
            except FileNotFoundError:  # another process evicted it
                self._forget(name)
                return None
            except OSError as exc:
                self._discard(path, str(exc))
                return None
            view = memoryview(raw)
            if len(raw) < _DIGEST or hashlib.sha256(view[:-_DIGEST]).digest() != view[-_DIGEST:]:
                self._discard(path, "its checksum does not match (damaged)")
                return None
            try:
                head = head_of(view)
            except BadFile as exc:
                self._discard(path, str(exc))
                return None
            if head.scope != scope or head.tokens != tokens or head.llama_cpp != LLAMA_CPP_COMMIT:
                self._discard(path, "it changed since it was indexed")
                return None
        with contextlib.suppress(OSError):
            os.utime(path)  # the LRU order: most recently used last to go
        return view[head.kv_start:head.kv_start + head.kv_bytes]

    def refused(self, name: str, why: str) -> None:
        with self._lock:
            self._discard(self.dir / f"{name}.kv", why)

    # -- writing ------------------------------------------------------------------
    def write_later(self, tokens: Sequence[int], data: bytes) -> None:
        """Queue a write for the writer thread (the engine's step does not wait for the disk)."""
        if self._closed or len(tokens) < BLOCK or min(tokens) < 0:
            return
        scope, description = self.scope()
        name = file_name(scope, tokens)
        with self._lock:
            if name in self._pending or name in self._entries or sum(self._pending.values()) + len(data) > _PENDING_MAX:
                return
            self._pending[name] = len(data)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="llamaplug-cache-writer", daemon=True)
                self._writer.start()
        self._queue.put((scope, description, tuple(tokens), data))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            scope, description, tokens, data = item
            try:
                self.write(scope, description, tokens, data)
            except Exception:  # noqa: BLE001 - a full disk or a vanished directory costs this entry only
                log.warning("prompt cache: could not write to %s", self.dir, exc_info=True)
            finally:
                with self._lock:
                    self._pending.pop(file_name(scope, tokens), None)

    def write(self, scope: str, description: dict[str, Any], tokens: tuple[int, ...], data: bytes) -> bool:
        """Write one file now (atomically, within the limit); whether it was written."""
        blocks, digest = chain(scope, tokens)
        name = digest.hex()
        parts = encode(scope, description, tokens, data)
        size = sum(len(p) for p in parts)
        if size > self.limit:
            return False
        target = self.dir / f"{name}.kv"
        with self._dir_locked():
            if target.exists():  # another process wrote this sequence first
                with contextlib.suppress(OSError):
                    os.utime(target)
                written = False
            else:
                self._make_room(size)
                tmp = self.dir / f"tmp-{secrets.token_hex(8)}"
                try:
                    with tmp.open("wb") as fh:
                        for part in parts:
                            fh.write(part)
                    os.replace(tmp, target)
                finally:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                written = True
        if scope != self.scope()[0]:
            return written
        with self._lock:
            if name not in self._entries:
                self._add(name, tokens, size, blocks)
            n = len(tokens)
            shorter = [other for other, e in self._entries.items()  # a prefix of this one says nothing more
                       if len(e.tokens) < n and tokens[:len(e.tokens)] == e.tokens]
            for other in shorter:
                with contextlib.suppress(OSError):
                    os.unlink(self.dir / f"{other}.kv")
                self._forget(other)
        self._note_usage()
        return written

    @contextlib.contextmanager
    def _dir_locked(self) -> Iterator[None]:
        with open(self.dir / "lock", "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _make_room(self, size: int) -> None:
        """Remove the least recently used files until `size` more bytes fit under the limit (lock held)."""
        files = _cache_files(self.dir)
        total = sum(f[1] for f in files)
        for _, n, path, fname in sorted(files):
            if total + size <= self.limit:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
                total -= n
                with self._lock:
                    self._forget(fname[:-3])

    # -- the whole store -----------------------------------------------------------
    def bytes_on_disk(self) -> int:
        return disk_usage(self.dir)

    def close(self) -> None:
        """Finish the queued writes."""
        self._closed = True
        writer = self._writer
        if writer is not None:
            self._queue.put(None)
            writer.join()
            self._writer = None


def disk_usage(directory: str | os.PathLike[str]) -> int:
    """Bytes of cache files (and writes under way) in `directory`."""
    try:
        return sum(size for _, size, _, _ in _cache_files(directory))
    except OSError:
        return 0


def _cache_files(directory: str | os.PathLike[str]) -> list[tuple[int, int, str, str]]:
    """(mtime_ns, size, path, name) of each cache file and write under way in `directory` (one gone while listed
    is left out); OSError where the directory cannot be listed."""
    files = []
    for item in os.scandir(directory):
        if _NAME.fullmatch(item.name) or _TMP.fullmatch(item.name):
            with contextlib.suppress(OSError):
                st = item.stat()
                files.append((st.st_mtime_ns, st.st_size, item.path, item.name))
    return files


def list_files(directory: str | os.PathLike[str]) -> list[tuple[Path, FileHead | str]]:
    """Each cache file in `directory` with its header, or why it cannot be read (`llamaplug cache list`)."""
    found: list[tuple[Path, FileHead | str]] = []
    for item in sorted(os.scandir(directory), key=lambda i: i.name):
        if _NAME.fullmatch(item.name):
            path = Path(item.path)
            try:
                found.append((path, read_head(path)))
            except (OSError, BadFile) as exc:
                found.append((path, str(exc)))
    return found


def clear_files(directory: str | os.PathLike[str]) -> tuple[int, int]:
    """Remove every cache file (and temporary file) in `directory`: (files, bytes) removed."""
    n = size = 0
    for _, bytes_, path, _ in _cache_files(directory):
        with contextlib.suppress(OSError):
            os.unlink(path)
            n, size = n + 1, size + bytes_
    return n, size


class TieredStore(PrefixStore):
    """The RAM tier (PrefixStore, `limit` bytes) over a DiskStore; counts hits and misses per tier in `stats`."""

    def __init__(self, limit: int, disk: DiskStore, stats: EngineStats):
        super().__init__(limit)
        self.disk = disk
        self.stats = stats
        self._on_disk: tuple[tuple[int, ...], str] | None = None  # what `best` found on disk only
        self._from_disk: tuple[tuple[int, ...], str] | None = None  # what `get` last gave from disk
        disk.stats = stats
        self._closed = False

    def best(self, prompt: Sequence[int]) -> tuple[tuple[int, ...], int]:
        key, n = super().best(prompt)
        if n == 0:
            self.stats.cache_ram_misses += 1
        self._on_disk = None
        try:
            found = self.disk.best(prompt)
        except Exception:  # noqa: BLE001 - the disk tier's trouble is a miss, never a failed request
            log.warning("prompt cache: lookup in %s failed", self.disk.dir, exc_info=True)
            found = None
        if found is not None and found[1] > n:
            self._on_disk = found[0], found[2]
            return found[0], found[1]
        if n == 0:
            self.stats.cache_disk_misses += 1
        return key, n

    def get(self, key: tuple[int, ...]) -> bytes | None:
        on_disk, self._on_disk = self._on_disk, None
        if on_disk is None or on_disk[0] != key:
            data = super().get(key)
            if data is not None:
                self.stats.cache_ram_hits += 1
            return data
        try:
            loaded = self.disk.load(on_disk[1], key)
        except Exception:  # noqa: BLE001
            log.warning("prompt cache: reading %s failed", self.disk.dir, exc_info=True)
            loaded = None
        if loaded is None:
            self.stats.cache_disk_misses += 1
            return None
        self.stats.cache_disk_hits += 1
        self._from_disk = key, on_disk[1]
        return loaded  # type: ignore[return-value]  # state_seq_set reads any buffer

    def origin(self, key: tuple[int, ...]) -> str:
        came = self._from_disk
        return "disk" if came is not None and came[0] == key else "ram"

    def refused(self, key: tuple[int, ...]) -> None:
        came = self._from_disk
        if came is not None and came[0] == key:
            self.disk.refused(came[1], "the context refused its KV (written for other settings)")
            self.stats.cache_disk_hits -= 1
            self.stats.cache_disk_misses += 1
            return
        super().refused(key)

    def evicted(self, key: tuple[int, ...], data: bytes) -> None:
        self._write(key, lambda: data)

    def prefilled(self, tokens: Sequence[int], read: int, seq_bytes: Callable[[], bytes]) -> None:
        if read >= PREFILL_WRITE:
            self._write(tokens, seq_bytes)

    def _write(self, tokens: Sequence[int], data: Callable[[], bytes], now: bool = False) -> None:
        try:
            if len(tokens) < BLOCK or min(tokens) < 0 or self.disk.covers(tokens):
                return
            if now:
                scope, description = self.disk.scope()
                self.disk.write(scope, description, tuple(tokens), data())
            else:
                self.disk.write_later(tokens, data())
        except Exception:  # noqa: BLE001 - the disk tier's trouble never fails a request
            log.warning("prompt cache: could not keep a sequence in %s", self.disk.dir, exc_info=True)

    def close(self, context: LlamaContext, slots: Sequence[tuple[int, Sequence[int]]]) -> None:
        if self._closed:
            return
        self._closed = True
        self.disk.close()  # the queued writes first: what follows may make them redundant
        for seq, tokens in slots:
            self._write(list(tokens), lambda seq=seq: context.state_seq_get(seq), now=True)
        for key, data in self.entries():
            self._write(key, lambda data=data: data, now=True)


def prompt_cache(ram_bytes: int, disk: DiskStore | None, stats: EngineStats) -> PrefixStore | None:
    """The engine's prompt cache: RAM only, RAM over disk, or none."""
    if disk is not None:
        return TieredStore(ram_bytes, disk, stats)
    return PrefixStore(ram_bytes) if ram_bytes > 0 else None


def open_disk_store(directory: str | os.PathLike[str] | None, limit_mib: int,
                    context: LlamaContext) -> DiskStore | None:
    """LlamaParams' cache_dir / cache_disk_mib: the disk tier, or None where there is none."""
    if directory is None or limit_mib <= 0:
        return None
    return DiskStore(directory, limit_mib << 20, context)
