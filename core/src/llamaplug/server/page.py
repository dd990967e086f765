"""The chat page: `/` and its files under `/static/` (in the package: the page works offline, with no CDN).

The page talks to the API like any client (/v1/models, /v1/chat/completions streamed),
so it needs no route of its own beyond its files, and no key: the key guards /v1/ only,
and the page sends the one its user enters.
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import Request
from fastapi.responses import FileResponse, Response

from .dialects import OPENAI
from .errors import NotFoundError

router = OPENAI.router()

STATIC = Path(__file__).resolve().parent / "static"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}
_NAME = re.compile(r"[A-Za-z0-9_-]+\.(html|js|css)")  # one level, no dots but the extension's: no way out of STATIC
# The page's own files only: model output cannot bring in a script or a remote resource, even if it became markup.
_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
           "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


@router.get("/", include_in_schema=False)
async def index(request: Request) -> FileResponse:
    return _file(request, "index.html")


# A llama head in a circle: browsers ask /favicon.ico whatever the page says, and a 404 there filled the log.
_ICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><circle cx="16" cy="16" r="15" fill="#6b4f2a"/>'
         '<path d="M11 26V13l-2-6 4 3h6l4-3-2 6v13z" fill="#f3e6cf"/></svg>')


@router.get("/favicon.ico", include_in_schema=False)
async def favicon(request: Request) -> Response:
    _page_on(request)
    return Response(_ICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})


@router.get("/static/{name}", include_in_schema=False)
async def static(request: Request, name: str) -> FileResponse:
    return _file(request, name)


def _page_on(request: Request) -> None:
    """With --no-webui none of the page's paths is served: 404, as llama-server's --no-webui."""
    if not request.app.state.webui:
        raise NotFoundError("the chat page is off (llamaplug serve --no-webui)")


def _file(request: Request, name: str) -> FileResponse:
    _page_on(request)
    path = STATIC / name
    if not _NAME.fullmatch(name) or not path.is_file():
        raise NotFoundError(f"no page file {name!r}")
    return FileResponse(path, media_type=_TYPES[path.suffix],
                        headers={"Content-Security-Policy": _POLICY, "Cache-Control": "no-cache"})
