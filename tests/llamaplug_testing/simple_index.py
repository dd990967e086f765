"""A package index (PEP 503 "simple" pages) over folders of wheels and sdists, served on 127.0.0.1.

What `pip install --index-url` reads from PyPI, made from local files, so that a test installs our
distributions the way a user will: plain pip, names and versions resolved by the index, no --find-links.
"""

from __future__ import annotations

import functools
import hashlib
import html
import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_NAME = re.compile(r"^([A-Za-z0-9_.]+?)-\d")


def _project(filename: str) -> str:
    match = _NAME.match(filename)
    if match is None:
        raise ValueError(f"not a wheel or sdist name: {filename}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def write_index(folders: Iterable[Path], root: Path) -> None:
    """root/simple/<project>/index.html for every .whl and .tar.gz in `folders`; the files linked under root/files."""
    projects: dict[str, list[Path]] = {}
    for folder in folders:
        for f in sorted(folder.iterdir()):
            if f.name.endswith((".whl", ".tar.gz")):
                projects.setdefault(_project(f.name), []).append(f)
    (root / "files").mkdir(parents=True, exist_ok=True)
    for project, files in projects.items():
        links = []
        for f in files:
            (root / "files" / f.name).unlink(missing_ok=True)
            (root / "files" / f.name).symlink_to(f.resolve())
            digest = hashlib.sha256(f.read_bytes()).hexdigest()
            links.append(f'<a href="../../files/{html.escape(f.name)}#sha256={digest}">{html.escape(f.name)}</a><br>')
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    names = "".join(f'<a href="{p}/">{p}</a><br>\n' for p in sorted(projects))
    (root / "simple" / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{names}</body></html>\n")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass


@contextmanager
def simple_index(folders: Iterable[Path], root: Path) -> Iterator[str]:
    """Serves the index over `folders` (written under `root`) on a free port; yields its URL."""
    write_index(folders, root)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()
