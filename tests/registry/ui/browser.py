"""Debian's chromium driven by Playwright, for the /ui tests; screenshots for CI."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

CHROMIUM = Path("/usr/bin/chromium")
# CI keeps this folder's screenshots (see docs/testing.md).
SCREENSHOTS = Path(os.environ.get("LORAPLANE_SCREENSHOTS",
                                  Path(__file__).parents[3] / "artifacts" / "screenshots"))
# Generous: a loaded CI machine; every wait ends as soon as its condition holds.
expect.set_options(timeout=30_000)


def require_chromium() -> Path:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/ci-tools.sh as root (it installs "
                    "Debian's chromium); Playwright cannot download a browser here",
                    pytrace=False)
    return CHROMIUM


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Headless Debian chromium; Playwright is pointed at it and downloads nothing."""
    path = require_chromium()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(path), headless=True)
        try:
            yield browser
        finally:
            await browser.close()


async def screenshot(page: Page, name: str) -> Path:
    path = SCREENSHOTS / f"{name}.png"  # Playwright makes the folders
    await page.screenshot(path=str(path), full_page=True)
    return path


async def sign_in(page: Page, url: str, headers: dict[str, str], path: str = "/ui") -> None:
    """Open ``path`` (a deep link, say) and sign in with the token of ``headers``."""
    await page.goto(f"{url}{path}")
    token = headers["Authorization"].removeprefix("Bearer ")
    await page.get_by_test_id("token-input").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_test_id("whoami")).to_be_visible()


@asynccontextmanager
async def signed_in_page(url: str, headers: dict[str, str], path: str = "/ui", *,
                         height: int = 900, feed: bool = True) -> AsyncIterator[Page]:
    """A page in a new chromium, signed in at ``path``; without ``feed``, the live
    stream is cut and the page keeps what it read until it reads again."""
    async with chromium() as browser:
        page = await browser.new_page(viewport={"width": 1280, "height": height})
        if not feed:
            await page.route("**/ui/api/stream", lambda route: route.abort())
        await sign_in(page, url, headers, path)
        yield page


async def scroll_width(page: Page) -> int:
    """How wide the page is laid out: wider than the viewport means it scrolls sideways."""
    width: int = await page.evaluate("document.documentElement.scrollWidth")
    return width
