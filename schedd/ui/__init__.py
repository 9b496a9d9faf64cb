"""The web dashboard: static HTML, CSS and ES modules served by every node at ``/ui/``.

The dashboard is a thin client of the public ``/api/v1``: the page itself carries no data and
needs no token (the operator pastes one, kept in the browser's sessionStorage, and every API
call sends it as a bearer token). So the files are served before the API's token check, by a
middleware that :func:`mount` puts in front of the application's own:

- ``GET /`` and ``GET /ui`` redirect to ``/ui/``;
- ``GET /ui/static/<file>`` is one of the shipped files (``schedd/ui/static``), 404 otherwise;
- any other ``GET /ui/…`` is the page (``index.html``): its script reads the path (``/ui/jobs``,
  ``/ui/runs/<id>``, …) and shows that screen, so a screen's address can be bookmarked;
- any other method is a 405 naming ``GET, HEAD``.

Every answer carries a strict Content-Security-Policy (only this origin's scripts and styles,
no inline script or style, no framing, no ``<base>``; the page may also connect to the
cluster's other nodes, to find one that serves it when its own goes away), ``X-Content-Type-Options: nosniff`` and
``Referrer-Policy: no-referrer``. The files are read once, when the application is built, and
answered from memory with an ETag (a browser revalidates them: ``Cache-Control: no-cache``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Final
from urllib.parse import urlsplit

from aiohttp import web

PREFIX: Final = "/ui/"
STATIC: Final = "/ui/static/"

CSP: Final = (
    "default-src 'self'; script-src 'self'; object-src 'none'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
SECURITY_HEADERS: Final[Mapping[str, str]] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}

#: the content type of each kind of file shipped (anything else is not served)
TYPES: Final[Mapping[str, str]] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """The shipped files by their path under ``static`` (``app.js``, ``screens/jobs.js``)."""
    assets: dict[str, Asset] = {}
    todo: list[tuple[str, Traversable]] = [("", resources.files(__package__).joinpath("static"))]
    while todo:
        prefix, folder = todo.pop()
        for entry in folder.iterdir():
            suffix = "." + entry.name.rpartition(".")[2]
            if entry.is_dir():
                todo.append((f"{prefix}{entry.name}/", entry))
            elif entry.is_file() and suffix in TYPES:
                body = entry.read_bytes()
                etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
                assets[prefix + entry.name] = Asset(body, TYPES[suffix], etag)
    return assets


def _answer(
    status: int,
    body: bytes = b"",
    content_type: str = "text/plain; charset=utf-8",
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    response = web.Response(
        status=status, body=body, headers={**SECURITY_HEADERS, **(headers or {})}
    )
    if body or status >= 400:
        response.headers["Content-Type"] = content_type
    return response


def page_csp(origins: Iterable[str]) -> str:
    """The page's policy: :data:`CSP`, and ``connect-src`` for this cluster's other nodes (a
    page whose node went away asks them whether they serve the dashboard: clusterbar.js)."""
    allowed = sorted({o for o in (_origin(u) for u in origins) if o is not None})
    if not allowed:
        return CSP
    return f"{CSP}; connect-src 'self' {' '.join(allowed)}"


def _origin(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or ";" in url or " " in url:
        return None
    return f"{parts.scheme}://{parts.netloc}"


def _serve(
    request: web.Request, asset: Asset, extra: Mapping[str, str] | None = None
) -> web.Response:
    headers = {"ETag": asset.etag, "Cache-Control": "no-cache", **(extra or {})}
    if request.headers.get("If-None-Match") == asset.etag:
        return _answer(304, headers=headers)
    return _answer(200, asset.body, asset.content_type, headers)


def is_ui_path(path: str) -> bool:
    return path in ("/", "/ui") or path.startswith(PREFIX)


def make_middleware(
    assets: Mapping[str, Asset], others: Callable[[], Iterable[str]] = tuple
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware that answers the dashboard's paths and passes every other request on;
    ``others``: the API URLs of the cluster's other nodes (the page may ask them)."""
    page = assets["index.html"]

    @web.middleware
    async def ui_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if not is_ui_path(path):
            return await handler(request)
        if request.method not in ("GET", "HEAD"):
            message = f"{request.method} is not allowed on {path}; expected one of GET, HEAD\n"
            return _answer(405, message.encode(), headers={"Allow": "GET, HEAD"})
        if path in ("/", "/ui"):
            return _answer(302, headers={"Location": PREFIX})
        if path.startswith(STATIC):
            asset = assets.get(path.removeprefix(STATIC))
            if asset is None:
                return _answer(404, f"no file {path}\n".encode())
            return _serve(request, asset)
        return _serve(request, page, {"Content-Security-Policy": page_csp(others())})

    return ui_middleware


def mount(app: web.Application, others: Callable[[], Iterable[str]] = tuple) -> None:
    """Serve the dashboard from ``app``: at ``/ui/``, ahead of its middlewares (the page needs
    no token; the API calls it makes do)."""
    app.middlewares.insert(0, make_middleware(load_assets(), others))
