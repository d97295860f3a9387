"""The /ui page in a real browser: sign-in, tenant scoping, and live updates as the
registry changes through its API (no reload), with screenshots of the main views."""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import Page, expect

from devharness.http_registry import Served
from devharness.registry import RegistryHarness
from tests.registry.agents.support import served
from tests.registry.ui.browser import chromium, screenshot
from tests.registry.ui.support import OTHER, OWN, promote, push, report_serving, rollback

PROBE = "window.__probe"


async def _scene(registry: RegistryHarness, tmp_path: Path) -> None:
    await registry.create_adapter("support-bot", tenant=OWN)
    await registry.create_adapter("summarizer", tenant=OWN)
    await registry.create_adapter("rival-bot", tenant=OTHER)
    await push(registry, "support-bot", tmp_path / "s1", 1, notes="baseline, 2k tickets")
    await push(registry, "summarizer", tmp_path / "m1", 2)
    await push(registry, "rival-bot", tmp_path / "r1", 3)
    for agent in ("gpu-a", "gpu-b", "gpu-c"):
        await report_serving(registry, agent, served("support-bot", 1),
                             served("summarizer", 1), served("rival-bot", 1))


async def _sign_in(page: Page, url: str, token: str) -> None:
    await page.goto(f"{url}/")  # redirects to /ui
    await expect(page.get_by_test_id("signin-form")).to_be_visible()
    assert page.url == f"{url}/ui"
    await page.get_by_test_id("token-input").fill("lp_not-a-real-token")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_test_id("signin-error")).to_contain_text("invalid_token")
    await expect(page.get_by_test_id("whoami")).to_be_hidden()
    await screenshot(page, "1-sign-in")
    await page.get_by_test_id("token-input").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_test_id("whoami")).to_contain_text(f"publisher · {OWN}")
    await expect(page.get_by_test_id("live-status")).to_have_text("live")
    await page.evaluate(f"{PROBE} = 'not reloaded'")


async def _timeline_follows_the_api(page: Page, registry: RegistryHarness, tmp_path: Path,
                                    headers: dict[str, str]) -> None:
    items = page.get_by_test_id("adapter-item")
    await expect(items).to_have_count(2)  # OWN's two; OTHER's rival-bot is not there
    await expect(page.locator('[data-name="rival-bot"]')).to_have_count(0)
    await page.locator('[data-testid=adapter-item][data-name="support-bot"]').click()
    entries = page.get_by_test_id("timeline-entry")
    await expect(entries).to_have_count(2)  # v1 and its publish move to live
    await push(registry, "support-bot", tmp_path / "s2", 4, aliases="",
               notes="more refund examples", headers=headers)
    await promote(registry, "support-bot", "live", 2, headers=headers)
    promoted = page.locator('[data-testid=timeline-entry][data-action="promote"]')
    await expect(promoted).to_have_attribute("data-version", "2")
    await expect(promoted).to_contain_text(f"live: v1 → v2 promoted by publisher-{OWN}")
    await expect(page.locator('[data-testid=alias][data-alias="live"]')).to_have_text(
        "live → v2")
    await expect(entries).to_have_count(4)
    await screenshot(page, "2-adapters-timeline")


async def _fleet_follows_the_agents(page: Page, registry: RegistryHarness) -> None:
    await page.get_by_test_id("tab-fleet").click()
    await expect(page.get_by_test_id("timeline")).to_be_hidden()
    live = page.locator('[data-name="support-bot"] [data-testid=fleet-alias][data-alias=live]')
    await expect(live).to_have_attribute("data-version", "2")
    await expect(live).to_have_attribute("data-converged", "false")
    await expect(live.get_by_test_id("pending")).to_have_count(3)
    others = (served("summarizer", 1), served("rival-bot", 1))
    await report_serving(registry, "gpu-a", served("support-bot", 2), *others)
    await report_serving(registry, "gpu-b", served("support-bot", 1), *others, failures=(
        served("support-bot", 2, "live", "failed", reason="rank 64 > max_lora_rank 32",
               code="rank_too_large"),))
    await expect(live.locator('[data-agent="gpu-a"][data-state="serving"]')).to_have_attribute(
        "data-version", "2")
    await expect(live.locator('[data-agent="gpu-b"][data-state="failed"]')).to_be_visible()
    await expect(live).to_contain_text("rank 64 > max_lora_rank 32 [rank_too_large]")
    await expect(live.get_by_test_id("pending")).to_have_count(1)  # gpu-c
    await expect(live.locator('[data-agent="gpu-c"][data-state="serving"]')).to_have_text(
        "gpu-c v1 behind")
    await expect(page.locator('[data-testid=fleet-adapter][data-name="rival-bot"]')
                 ).to_have_count(0)
    await screenshot(page, "3-fleet")


async def test_page_signs_in_and_follows_the_registry_live(http_registry: Served,
                                                           tmp_path: Path) -> None:
    registry, url = http_registry.harness, http_registry.url
    await _scene(registry, tmp_path)
    publisher = await registry.token("publisher", OWN)
    async with chromium() as browser:
        context = await browser.new_context(viewport={"width": 1280, "height": 800})
        page = await context.new_page()
        requested: list[str] = []
        page.on("request", lambda request: requested.append(request.url))
        await _sign_in(page, url, publisher["Authorization"].removeprefix("Bearer "))
        await _timeline_follows_the_api(page, registry, tmp_path, publisher)
        await _fleet_follows_the_agents(page, registry)
        await rollback(registry, "support-bot", "live", headers=publisher)
        live = page.locator('[data-name="support-bot"] [data-testid=fleet-alias]'
                            '[data-alias=live]')
        await expect(live).to_have_attribute("data-version", "1")
        await page.get_by_test_id("tab-adapters").click()
        await expect(page.locator('[data-testid=timeline-entry][data-action="rollback"]')
                     ).to_contain_text("live: v2 → v1 rolled back")
        assert await page.evaluate(PROBE) == "not reloaded"
        assert await context.cookies() == []
        # Everything the page loaded came from the registry itself.
        assert requested and all(u.startswith(f"{url}/") for u in requested), requested
        await page.reload()  # the token is kept for the tab, in sessionStorage
        await expect(page.get_by_test_id("whoami")).to_contain_text(OWN)
        await page.get_by_test_id("signout").click()
        await expect(page.get_by_test_id("signin-form")).to_be_visible()
        assert await page.evaluate("sessionStorage.length") == 0
