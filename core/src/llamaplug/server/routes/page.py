"""The chat page: `/` and its files under `/static/` (in the package: the page works offline, with no CDN).

The page talks to the API like any client (/v1/models, /v1/chat/completions streamed),
so it needs no route of its own beyond its files, and no key: the key guards /v1/ only,
and the page sends the one its user enters.
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.responses import FileResponse

from ..dialects import OPENAI
from ..errors import ApiError

router = OPENAI.router()

STATIC = Path(__file__).resolve().parent.parent / "static"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}
_NAME = re.compile(r"[A-Za-z0-9_-]+\.(html|js|css)")  # one level, no dots but the extension's: no way out of STATIC
# The page's own files only: model output cannot bring in a script or a remote resource, even if it became markup.
_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
           "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return _file("index.html")


@router.get("/static/{name}", include_in_schema=False)
async def static(name: str) -> FileResponse:
    return _file(name)


def _file(name: str) -> FileResponse:
    path = STATIC / name
    if not _NAME.fullmatch(name) or not path.is_file():
        raise ApiError(404, f"no page file {name!r}", code="not_found")
    return FileResponse(path, media_type=_TYPES[path.suffix],
                        headers={"Content-Security-Policy": _POLICY, "Cache-Control": "no-cache"})
