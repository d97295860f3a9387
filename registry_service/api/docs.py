"""The API's pages, ``/docs`` (Swagger UI) and ``/redoc``, loading nothing from elsewhere.

The registry often runs where there is no internet, and a page that fetches from a CDN
tells a third party who reads the docs. The assets are the ones the ``fastapi-offline``
package ships, served from ``/static-offline-docs``, with two things changed that would
still go out: ReDoc's footer fetches Redocly's logo from ``cdn.redoc.ly`` (the URL is
written into ``redoc.standalone.js``, so the file is served with it replaced by a local
image), and Swagger UI sends the description to ``validator.swagger.io`` for a badge
unless ``validatorUrl`` is null. The pages' Content-Security-Policy allows this origin
only, so anything missed here is blocked rather than fetched.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, HTTPException
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, Response

ASSETS_URL = "/static-offline-docs"
_STATIC = Path(fastapi_offline.__file__).parent / "static"
_REDOC_LOGO = (b"https://cdn.redoc.ly/redoc/logo-mini.svg", b"/static-offline-docs/logo.svg")
# A blank image where ReDoc's footer shows Redocly's logo.
_BLANK_SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>'
_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png",
          ".svg": "image/svg+xml"}
_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")
_PAGE_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; "
             "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
             "worker-src 'self' blob:; connect-src 'self'; font-src 'self' data:")
_CACHE = "public, max-age=86400"


@cache
def asset(name: str) -> bytes:
    """An asset's bytes, read once; ReDoc's with the CDN logo made local."""
    if name == "logo.svg":
        return _BLANK_SVG
    if name not in _FILES:
        raise HTTPException(404)
    data = (_STATIC / name).read_bytes()
    return data.replace(*_REDOC_LOGO) if name == "redoc.standalone.js" else data


def _page(html: HTMLResponse) -> HTMLResponse:
    html.headers["Content-Security-Policy"] = _PAGE_CSP
    return html


def install_docs(app: FastAPI, title: str) -> None:
    """Add ``/docs``, its OAuth2 redirect, ``/redoc`` and their assets to ``app``."""
    openapi_url = app.openapi_url or "/openapi.json"
    redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return _page(get_swagger_ui_html(
            openapi_url=openapi_url, title=f"{title} - Swagger UI",
            oauth2_redirect_url=redirect_url,
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None}))

    @app.get(redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return _page(get_swagger_ui_oauth2_redirect_html())

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return _page(get_redoc_html(
            openapi_url=openapi_url, title=f"{title} - ReDoc",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png", with_google_fonts=False))

    @app.get(ASSETS_URL + "/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> Response:
        return Response(asset(name), media_type=_TYPES[Path(name).suffix],
                        headers={"Cache-Control": _CACHE})
