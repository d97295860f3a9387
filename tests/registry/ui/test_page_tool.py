"""The /ui page as an operator's tool, in Chromium: search and filter with deep links that
survive a reload and follow back and forward, a version's details and a diff of two,
promote and rollback (with compare-and-set, and only for roles that may), honest alias
states, and a phone-width layout."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from playwright.async_api import Page, expect

from devharness.http_registry import Served
from devharness.registry import RegistryHarness
from tests.registry.agents.support import served
from tests.registry.auth.principals import assert_error
from tests.registry.ui.browser import (
    chromium,
    screenshot,
    scroll_width,
    sign_in,
    signed_in_page,
)
from tests.registry.ui.support import OTHER, OWN, push, report_serving

VERSIONS_OF_SUPPORT_BOT = "/ui#/adapters/support-bot?tab=versions&v=2"


async def _scene(registry: RegistryHarness, tmp_path: Path) -> None:
    """OWN: support-bot v1 (live, converged) and v2 (rank 16, no alias); summarizer
    (live failing on one agent); idle-bot (a version, no alias); empty-bot (no
    version); vision-bot (live, but no agent of its base model). OTHER: rival-bot."""
    for name in ("support-bot", "summarizer", "idle-bot", "empty-bot"):
        await registry.create_adapter(name, tenant=OWN)
    await registry.create_adapter("vision-bot", tenant=OWN, base_model="big-llama")
    await registry.create_adapter("rival-bot", tenant=OTHER)
    await push(registry, "support-bot", tmp_path / "s1", 1, notes="baseline")
    await push(registry, "support-bot", tmp_path / "s2", 2, aliases="", rank=16,
               extra_config={"lora_dropout": 0.1}, notes="more refund examples")
    await push(registry, "summarizer", tmp_path / "m1", 3)
    await push(registry, "idle-bot", tmp_path / "i1", 4, aliases="")
    await push(registry, "vision-bot", tmp_path / "v1", 5, base_model="big-llama")
    await push(registry, "rival-bot", tmp_path / "r1", 6)
    await report_serving(registry, "gpu-a", served("support-bot", 1), served("summarizer", 1))
    await report_serving(registry, "gpu-b", served("support-bot", 1), failures=(
        served("summarizer", 1, "live", "failed", reason="out of memory", code="oom"),))


@asynccontextmanager
async def _signed_in(served_at: Served, tmp_path: Path, role: str, path: str = "/ui", *,
                     feed: bool = True) -> AsyncIterator[tuple[Page, dict[str, str]]]:
    """The scene, and a page signed in at ``path`` with a new ``role`` token of OWN."""
    await _scene(served_at.harness, tmp_path)
    headers = await served_at.harness.token(role, OWN)
    async with signed_in_page(served_at.url, headers, path, feed=feed) as page:
        yield page, headers


async def _names(page: Page) -> list[str]:
    items = page.get_by_test_id("adapter-item")
    return [n or "" for n in await items.evaluate_all("els => els.map(e => e.dataset.name)")]


async def _expect_names(page: Page, *names: str) -> None:
    await expect(page.get_by_test_id("adapter-item")).to_have_count(len(names))
    assert sorted(await _names(page)) == sorted(names)


async def _search_and_filter(page: Page) -> None:
    await _expect_names(page, "empty-bot", "idle-bot", "summarizer", "support-bot",
                        "vision-bot")
    search = page.get_by_test_id("search")
    await search.fill("summ")
    await _expect_names(page, "summarizer")
    assert page.url.endswith("#/adapters?q=summ")
    await page.reload()  # the search survives it
    await expect(search).to_have_value("summ")
    await _expect_names(page, "summarizer")
    await search.fill("big-llama")  # by base model
    await _expect_names(page, "vision-bot")
    await search.fill(OWN)  # by tenant: every one of OWN's
    await expect(page.get_by_test_id("adapter-item")).to_have_count(5)
    await search.fill("")
    state = page.get_by_test_id("state-filter")
    for wanted, names in (("not served", ("idle-bot", "empty-bot")),
                          ("no agents", ("vision-bot",)), ("failing", ("summarizer",)),
                          ("converged", ("support-bot",))):
        await state.select_option(wanted)
        await _expect_names(page, *names)
    await state.select_option("")
    await expect(page.get_by_test_id("adapter-item")).to_have_count(5)


async def _version_and_diff(page: Page) -> None:
    await page.locator('[data-testid=adapter-item][data-name="support-bot"]').click()
    await page.get_by_test_id("subtab-versions").click()
    await page.locator('[data-testid=version-item][data-version="2"]').click()
    details = page.get_by_test_id("version-details")
    await expect(details).to_have_attribute("data-version", "2")
    await expect(details.get_by_test_id("v-rank")).to_have_text("16")
    await expect(details.get_by_test_id("v-alpha")).to_have_text("16")
    await expect(details.get_by_test_id("v-targets")).to_have_text("q_proj, v_proj")
    await expect(details.get_by_test_id("v-base-model")).to_have_text("tiny-llama")
    await expect(details.get_by_test_id("v-uploader")).to_have_text("bootstrap-admin")
    await expect(details.get_by_test_id("v-notes")).to_have_text("more refund examples")
    await expect(details.get_by_test_id("v-file")).to_have_count(2)
    await expect(details.locator('[data-testid=v-file][data-name="adapter_model.safetensors"]')
                 ).to_contain_text("KiB")
    await page.get_by_test_id("compare").select_option("1")
    diff = page.get_by_test_id("diff")
    await expect(diff).to_have_attribute("data-base", "1")
    await expect(diff.locator('[data-testid=diff-config][data-key="r"]')).to_have_text(
        "~ r: 8 → 16")
    await expect(diff.locator('[data-testid=diff-config][data-key="lora_dropout"]')
                 ).to_be_visible()
    await expect(diff.locator('[data-testid=diff-file][data-name="adapter_model.safetensors"]')
                 ).to_have_attribute("data-change", "changed")
    assert page.url.endswith("#/adapters/support-bot?tab=versions&v=2&base=1")


async def test_search_filter_details_and_diff_survive_reload_and_history(
        http_registry: Served, tmp_path: Path) -> None:
    async with _signed_in(http_registry, tmp_path, "publisher") as (page, _):
        await _search_and_filter(page)
        await _version_and_diff(page)
        await page.reload()  # the tab, the adapter, the version and the diff come back
        await expect(page.get_by_test_id("diff")).to_have_attribute("data-head", "2")
        await expect(page.get_by_test_id("subtab-versions")).to_have_attribute(
            "aria-selected", "true")
        await screenshot(page, "4-version-diff")
        await page.go_back()  # no diff
        await expect(page.get_by_test_id("diff")).to_have_count(0)
        await expect(page.get_by_test_id("version-details")).to_have_attribute(
            "data-version", "2")
        await page.go_back()  # no version chosen
        await expect(page.get_by_test_id("version-details")).to_have_count(0)
        await page.go_back()  # the timeline
        await expect(page.get_by_test_id("timeline-entry")).to_have_count(3)
        await page.go_forward()
        await expect(page.get_by_test_id("subtab-versions")).to_have_attribute(
            "aria-selected", "true")
        await page.get_by_test_id("tab-fleet").click()
        await expect(page.get_by_test_id("fleet")).to_be_visible()
        await page.go_back()
        await expect(page.get_by_test_id("fleet")).to_be_hidden()
        await expect(page.get_by_test_id("version-item")).to_have_count(2)


async def _click_twice(page: Page, testid: str, alias: str, armed: str) -> None:
    """An action asks for a second click, saying what it will do."""
    action = page.locator(f'[data-testid={testid}][data-alias="{alias}"]')
    await action.click()
    await expect(action).to_have_text(armed)
    await action.click()


async def _alias_version(registry: RegistryHarness, name: str, alias: str) -> int | None:
    response = await registry.client.get(f"/v1/adapters/{name}",
                                         headers=registry.admin_headers)
    assert response.status_code == 200, response.text
    return next((a["version"] for a in response.json()["aliases"] if a["alias"] == alias),
                None)


async def test_promote_and_rollback_from_the_page(http_registry: Served,
                                                  tmp_path: Path) -> None:
    registry = http_registry.harness
    async with _signed_in(http_registry, tmp_path, "publisher",
                          VERSIONS_OF_SUPPORT_BOT) as (page, _):  # a deep link
        notice = page.get_by_test_id("notice")
        chip = page.locator('[data-testid=alias][data-alias="live"]')
        await _click_twice(page, "promote", "live", "confirm: live v1 → v2")
        await expect(notice).to_have_text("live now points at v2 (revision 2).")
        await expect(chip).to_have_text("live → v2")
        assert await _alias_version(registry, "support-bot", "live") == 2
        await expect(page.get_by_test_id("promote")).to_have_count(0)  # live is at v2
        await _click_twice(page, "rollback", "live", "confirm: roll back live")
        await expect(notice).to_have_text("live now points at v1 (revision 3).")
        await expect(chip).to_have_text("live → v1")
        assert await _alias_version(registry, "support-bot", "live") == 1
        await screenshot(page, "5-promote")


async def test_a_move_behind_the_pages_back_is_a_conflict(http_registry: Served,
                                                          tmp_path: Path) -> None:
    """The page sends the alias's revision it showed: if the alias moved since, the
    registry refuses (409), and the page says so and shows the alias as it is now."""
    registry = http_registry.harness
    async with _signed_in(http_registry, tmp_path, "publisher", VERSIONS_OF_SUPPORT_BOT,
                          feed=False) as (page, _):
        await expect(page.get_by_test_id("version-details")).to_be_visible()
        response = await registry.client.put(
            "/v1/adapters/support-bot/aliases/live", json={"version": 2},
            headers=registry.admin_headers)
        assert response.status_code == 200, response.text
        await page.get_by_test_id("subtab-timeline").click()
        await _click_twice(page, "rollback", "live", "confirm: roll back live")
        await expect(page.get_by_test_id("notice")).to_contain_text(
            "Not moved: alias 'live' is at revision 2, not 1")
        await expect(page.locator('[data-testid=alias][data-alias="live"]')).to_have_text(
            "live → v2")
        assert await _alias_version(registry, "support-bot", "live") == 2


async def test_a_reader_sees_no_actions_and_the_registry_refuses_them(
        http_registry: Served, tmp_path: Path) -> None:
    registry = http_registry.harness
    async with _signed_in(http_registry, tmp_path, "reader",
                          VERSIONS_OF_SUPPORT_BOT) as (page, reader):
        await expect(page.get_by_test_id("v-rank")).to_have_text("16")
        await expect(page.locator('[data-testid=alias][data-alias="live"]')).to_be_visible()
        await expect(page.get_by_test_id("promote")).to_have_count(0)
        await expect(page.get_by_test_id("rollback")).to_have_count(0)
    put = await registry.client.put("/v1/adapters/support-bot/aliases/live",
                                    json={"version": 2, "expected_revision": 1},
                                    headers=reader)
    assert_error(put, 403, "insufficient_role")
    back = await registry.client.post("/v1/adapters/support-bot/aliases/live/rollback",
                                      json={"expected_revision": 1}, headers=reader)
    assert_error(back, 403, "insufficient_role")


async def test_states_read_honestly(http_registry: Served, tmp_path: Path) -> None:
    """No agents is not a rollout; no alias is not served; no version is said so."""
    async with _signed_in(http_registry, tmp_path, "publisher", "/ui#/fleet") as (page, _):
        vision = page.locator('[data-name="vision-bot"] [data-testid=fleet-alias]')
        await expect(vision).to_contain_text("no agents")
        await expect(vision).not_to_contain_text("rolling")
        await expect(vision).to_have_attribute("data-state", "no agents")
        await expect(vision.get_by_test_id("alias-state")).to_have_text("no agents")
        summarizer = page.locator('[data-name="summarizer"] [data-testid=fleet-alias]')
        await expect(summarizer).to_have_attribute("data-state", "failing")
        await expect(summarizer).to_contain_text("out of memory [oom]")
        await expect(page.locator('[data-name="support-bot"] [data-testid=alias-state]')
                     ).to_have_text("converged")
        for name in ("idle-bot", "empty-bot"):
            await expect(page.locator(f'[data-name="{name}"] [data-testid=no-alias]')
                         ).to_have_text("Not served: no alias points at a version.")
        await screenshot(page, "6-fleet-states")
        await page.get_by_test_id("tab-adapters").click()
        empty = page.locator('[data-testid=adapter-item][data-name="empty-bot"]')
        await expect(empty).to_contain_text("no versions yet")
        await expect(empty).not_to_contain_text("latest v")
        await expect(empty.get_by_test_id("adapter-state")).to_have_text(
            "not served (no alias)")
        await expect(page.locator('[data-testid=adapter-item][data-name="vision-bot"] '
                                  '[data-testid=adapter-state]')).to_have_text(
            "live v1 no agents")
        await empty.click()
        detail = page.get_by_test_id("timeline")
        await expect(detail.get_by_test_id("no-alias")).to_be_visible()
        await expect(detail).to_contain_text("No versions yet")


async def test_the_page_fits_a_phone(http_registry: Served, tmp_path: Path) -> None:
    """At 390 px wide nothing scrolls sideways: sign-in, adapters, a diff, the fleet."""
    registry, url = http_registry.harness, http_registry.url
    await _scene(registry, tmp_path)
    await report_serving(registry, "gpu-c-with-a-rather-long-agent-identifier",
                         served("support-bot", 1), failures=(served(
                             "summarizer", 1, "live", "failed", code="rank_too_large",
                             reason="rank 64 > max_lora_rank 32 on this vLLM server"),))
    publisher = await registry.token("publisher", OWN)
    async with chromium() as browser:
        page = await browser.new_page(viewport={"width": 390, "height": 844})
        await page.goto(f"{url}/ui")
        await expect(page.get_by_test_id("signin-form")).to_be_visible()
        assert await scroll_width(page) <= 390
        await sign_in(page, url, publisher)
        await page.get_by_test_id("tab-fleet").click()
        await expect(page.locator('[data-name="summarizer"] [data-testid=fleet-alias]')
                     ).to_contain_text("rank 64 > max_lora_rank 32")
        assert await scroll_width(page) <= 390
        await screenshot(page, "8-phone-fleet")
        await page.get_by_test_id("tab-adapters").click()
        await page.locator('[data-testid=adapter-item][data-name="support-bot"]').click()
        await expect(page.get_by_test_id("timeline-entry")).to_have_count(3)
        assert await scroll_width(page) <= 390
        await page.goto(f"{url}{VERSIONS_OF_SUPPORT_BOT}&base=1")
        await expect(page.get_by_test_id("diff")).to_be_visible()
        assert await scroll_width(page) <= 390
        await screenshot(page, "7-phone-version")
