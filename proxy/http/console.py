"""The operator's console: a single-page application served at ``/ui/`` (CONTRACT v3 "Console").

Plain HTML, CSS and JavaScript shipped as package data (``proxy/http/console/``: ``index.html``,
``console.css``, ``console.js``); no framework, nothing fetched at run time, so it works on a
machine without internet. The page only calls the HTTP API, from the same origin, with the
credentials the browser already holds for the page: ``GET /v1/cluster`` (the overview,
proxy/http/cluster.py), ``GET /v1/pending`` and ``GET /v1/messages?state=pending...`` (pending
messages and their counts), ``GET``/``PUT``/``DELETE /v1/messages/{id}`` and ``DELETE
/v1/messages?id_prefix=...`` (a message, its cancel and replacement, bulk cancel). So it shows
and does exactly what the caller may: a non-administrator sees its own messages only.

Authentication is the HTTP API's (proxy/http/login.py): ``/ui/`` is no open path, so with
``http_auth = "kafka"`` the page itself answers 401 with ``WWW-Authenticate: Basic`` and the
browser asks for the Kafka user and password. The answers forbid framing and caching and
carry a Content-Security-Policy allowing the page's own files only (no inline script).

Concurrency: the files are read once, at start, on the caller's thread; the routes run on the
proxy's asyncio loop and only return those bytes.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

from fastapi import FastAPI, Response
from fastapi.responses import RedirectResponse

from kdelay.proxy.http.errors import ApiError

#: The console's files (proxy/http/console/) and their media types.
ASSETS: Final = {
    "index.html": "text/html; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
}
HEADERS: Final = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}


class AssetNotFoundError(ApiError):
    """No such file in the console (404)."""

    status = 404


def load_assets() -> dict[str, bytes]:
    """The console's files, from the installed ``kdelay.proxy.http`` package."""
    folder = resources.files("kdelay.proxy.http").joinpath("console")
    return {name: folder.joinpath(name).read_bytes() for name in ASSETS}


def install_console(app: FastAPI) -> None:
    """``/ui/`` (the page), ``/ui/{file}`` (its script and style) and ``/ui`` (a redirect)."""
    assets = load_assets()

    def answer(name: str) -> Response:
        return Response(assets[name], media_type=ASSETS[name], headers=HEADERS)

    @app.get("/ui", include_in_schema=False)
    async def console_redirect() -> Response:
        return RedirectResponse("/ui/", status_code=308)

    @app.get("/ui/", include_in_schema=False)
    async def console_page() -> Response:
        return answer("index.html")

    @app.get("/ui/{name}", include_in_schema=False)
    async def console_file(name: str) -> Response:
        if name not in assets or name == "index.html":
            raise AssetNotFoundError(f"/ui/{name}: the console has no such file", field="path")
        return answer(name)
