"""/docs and /redoc in a real browser load nothing from anywhere but the registry.

Chromium opens each page over real HTTP and every request it makes is recorded, the
images and scripts the page's own scripts ask for included (ReDoc's footer logo was one,
from cdn.redoc.ly); each must go to the registry and succeed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Page, Request, Response, expect

from devharness.http_registry import Served, serve_http
from devharness.services import NatsService
from tests.registry.ui.browser import chromium


@pytest.fixture
async def served(tmp_path: Path, nats: NatsService) -> AsyncIterator[Served]:
    async with serve_http("embedded", tmp_path / "data", nats) as served:
        yield served


async def _redoc_rendered(page: Page) -> None:
    await expect(page.get_by_text("API docs by Redocly")).to_be_visible()
    await expect(page.get_by_role("heading", name="loraplane registry")).to_be_visible()


async def _swagger_rendered(page: Page) -> None:
    await expect(page.locator(".opblock").first).to_be_visible()
    await expect(page.get_by_role("heading", name="loraplane registry")).to_be_visible()


@pytest.mark.parametrize("path", ["/redoc", "/docs"])
async def test_a_docs_page_loads_only_from_the_registry(served: Served, path: str) -> None:
    requested: list[str] = []
    failed: list[str] = []
    async with chromium() as browser:
        page = await browser.new_page()
        page.on("request", lambda request: requested.append(request.url))
        page.on("requestfailed", lambda request: failed.append(_failure(request)))
        page.on("response", lambda response: failed.extend(_error(response)))
        await page.goto(f"{served.url}{path}")
        await (_redoc_rendered(page) if path == "/redoc" else _swagger_rendered(page))
        await page.wait_for_load_state("networkidle")
    elsewhere = [url for url in requested
                 if not url.startswith((served.url + "/", "data:", "blob:"))]
    assert not elsewhere, f"{path} fetched from elsewhere: {elsewhere}"
    assert f"{served.url}/openapi.json" in requested
    assert not failed, failed


def _failure(request: Request) -> str:
    return f"{request.url}: {request.failure}"


def _error(response: Response) -> list[str]:
    return [f"{response.url}: {response.status}"] if response.status >= 400 else []
