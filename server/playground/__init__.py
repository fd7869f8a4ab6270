"""The playground page: ``/`` and its files under ``/static/``, served from ``server/static/``.

The page is plain HTML, CSS and ES modules (no build step) and talks to this server's own API
with ``fetch``, so it is as good a client of the API as any: what it shows, the API returns.
It must work offline, so the Content-Security-Policy allows only this origin; a stray CDN
link would fail loudly in the browser (and in tests/test_playground_browser.py) instead of
quietly working on a developer's machine and breaking on an air-gapped one.

Only the files present at start are served (a fixed map, no path joins on user input), and the
page is public like ``/health``: the API calls it makes carry the key the user types in.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from server.http.errors import APIError

STATIC_DIR = Path(__file__).resolve().parent / "static"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",  # ES modules need a JavaScript MIME type, whatever the OS maps
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-cache",  # revalidate, so a restarted (upgraded) server's page is the one shown
    "X-Content-Type-Options": "nosniff",
}


def static_files(root: Path = STATIC_DIR) -> dict[str, Path]:
    """Every servable file under ``root`` by its URL path relative to ``/static/``."""
    return {
        path.relative_to(root).as_posix(): path
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.suffix in MEDIA_TYPES
    }


def _file(path: Path) -> FileResponse:
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=HEADERS)


def playground_router(root: Path = STATIC_DIR) -> APIRouter:
    """``GET /`` (the page) and ``GET /static/{path}`` (its modules, styles and icon)."""
    files = static_files(root)
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def index() -> FileResponse:
        return _file(files["index.html"])

    @router.get("/static/{path:path}")
    async def asset(path: str) -> FileResponse:
        if path not in files:
            raise APIError(404, f"no playground file {path!r}", code="not_found")
        return _file(files[path])

    return router
