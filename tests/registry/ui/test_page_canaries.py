"""Canaries on the /ui page, in Chromium: a running canary shown live (its steps with the
current one marked, its weight, and every check canary against stable with its verdict);
a publisher pauses, resumes, aborts and promotes from the page (through the registry's own
canary routes, with the page's bearer token); a refused action said in words; a reader
shown no button, and the call refused when forged from the page anyway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from playwright.async_api import Locator, Page, expect

from devharness.http_registry import Served
from devharness.registry import RegistryHarness
from tests.registry.canaries.support import (
    ANALYSIS,
    CANARY,
    alias_version,
    bot,
    call,
    make_due,
    report,
    side,
    start_canary,
)
from tests.registry.ui.browser import (
    screenshot,
    scroll_width,
    signed_in_page,
)
from tests.registry.ui.support import OWN

BOT = "/ui#/adapters/bot"


async def _start(registry: RegistryHarness, version: int = 2) -> int:
    status, canary = await start_canary(registry, version, steps=[10, 50], step_seconds=600,
                                        analysis=ANALYSIS)
    assert status == 201, canary
    return int(canary["id"])


@asynccontextmanager
async def _page(served_at: Served, role: str, *, feed: bool = True
                ) -> AsyncIterator[tuple[Page, dict[str, str]]]:
    """A page signed in at bot's timeline with a new ``role`` token of OWN (bot's)."""
    headers = await served_at.harness.token(role, OWN)
    async with signed_in_page(served_at.url, headers, BOT, height=1000, feed=feed) as page:
        yield page, headers


def _check(card: Locator, kind: str, metric: str) -> Locator:
    return card.locator(f'[data-testid=canary-checks][data-kind="{kind}"] '
                        f'[data-testid=canary-check][data-metric="{metric}"]')


async def _expect_check(card: Locator, kind: str, metric: str, stable: str, canary: str,
                        verdict: str) -> None:
    row = _check(card, kind, metric)
    await expect(row.get_by_test_id("check-stable")).to_have_text(stable)
    await expect(row.get_by_test_id("check-canary")).to_have_text(canary)
    await expect(row.get_by_test_id("verdict")).to_have_text(verdict)
    await expect(row).to_have_attribute("data-verdict", verdict)


async def _canary_state(registry: RegistryHarness) -> str | None:
    status, body = await call(registry, "GET", CANARY)
    return str(body["state"]) if status == 200 else None


async def _shows_the_canary_live(page: Page, registry: RegistryHarness, cid: int) -> Locator:
    card = page.locator('[data-testid=canary][data-alias="live"]')
    await expect(card).to_have_attribute("data-id", str(cid))
    await expect(card.get_by_test_id("canary-steps")).to_have_text("10% → 50%")
    current = card.locator("[data-testid=canary-step][data-current=true]")
    await expect(current).to_have_text("10%")
    await expect(current).to_have_attribute("aria-current", "step")
    await expect(card.get_by_test_id("canary-weight")).to_have_text(
        "v2 takes 10% of live's traffic, v1 the other 90%.")
    await expect(card.get_by_test_id("canary-state")).to_have_text("progressing")
    await expect(card.get_by_test_id("canary-reason")).to_have_text(
        "started by bootstrap-admin: version 2 on 10% of 'live'")
    await expect(page.locator('[data-testid=adapter-canary][data-alias="live"]')).to_have_text(
        "live canary v2 at 10% progressing")
    await _expect_check(card, "live", "requests", "0", "0", "inconclusive")
    # Traffic comes in: the checks of the step so far follow it, with no reload.
    await report(registry, "gpu-1", side(cid, "stable", 80, seconds=0.02),
                 side(cid, "canary", 40, errors=1, seconds=0.05))
    await _expect_check(card, "live", "requests", "80", "40", "pass")
    await _expect_check(card, "live", "error_rate", "0.00%", "2.50%", "pass")
    await _expect_check(card, "live", "error_rate_increase", "0.00%", "2.50%", "fail")
    await _expect_check(card, "live", "latency_p95", "24 ms", "49 ms", "fail")
    await _expect_check(card, "live", "load_failures", "0", "0", "pass")
    await expect(_check(card, "live", "error_rate_increase").get_by_test_id("check-limit")
                 ).to_have_text("≤ 1.00%")
    await expect(card.locator('[data-testid=canary-checks][data-kind="judged"]')
                 ).to_contain_text("No step judged yet.")
    return card


async def _judged_then_paused_resumed_aborted(page: Page, registry: RegistryHarness,
                                              card: Locator, cid: int) -> None:
    # Even traffic, and the step due: the analysis passes it and goes on to 50 %.
    await report(registry, "gpu-1", side(cid, "stable", 160), side(cid, "canary", 120))
    await make_due(registry, cid)
    current = card.locator("[data-testid=canary-step][data-current=true]")
    await expect(current).to_have_text("50%")
    await expect(card.get_by_test_id("canary-weight")).to_contain_text("v2 takes 50%")
    judged = card.locator('[data-testid=canary-checks][data-kind="judged"]')
    await expect(judged.get_by_test_id("canary-check")).not_to_have_count(0)
    for check in await judged.get_by_test_id("canary-check").all():
        await expect(check.get_by_test_id("verdict")).to_have_text("pass")
    await _expect_check(card, "judged", "requests", "160", "120", "pass")
    await screenshot(page, "9-canary")

    notice = page.get_by_test_id("canary-notice")
    await card.get_by_test_id("canary-reason-input").fill("looking at the dashboards")
    await card.get_by_test_id("canary-pause").click()
    await expect(card.get_by_test_id("canary-state")).to_have_text("paused")
    await expect(notice).to_have_text(
        f"Canary {cid} on live paused at 50% "
        f"(paused by publisher-{OWN}: looking at the dashboards).")
    assert await _canary_state(registry) == "paused"
    await expect(card.get_by_test_id("canary-pause")).to_have_count(0)
    await expect(card.get_by_test_id("canary-reason-input")).to_have_value("")
    await card.get_by_test_id("canary-resume").click()
    await expect(card.get_by_test_id("canary-state")).to_have_text("progressing")
    assert await _canary_state(registry) == "progressing"

    await card.get_by_test_id("canary-reason-input").fill("latency looks off")
    abort = card.get_by_test_id("canary-abort")
    await abort.click()  # arms it
    await expect(abort).to_have_text("confirm: abort, live stays on v1")
    await abort.click()
    await expect(notice).to_have_text(
        f"Canary {cid} aborted: live stays on v1 "
        f"(aborted by publisher-{OWN}: latency looks off).")
    await expect(page.get_by_test_id("canary")).to_have_count(0)
    await expect(page.get_by_test_id("no-canary")).to_have_text(
        "No canary runs on bot's aliases.")
    await expect(page.get_by_test_id("adapter-canary")).to_have_count(0)
    assert await _canary_state(registry) is None
    aborted = page.locator('[data-testid=timeline-entry][data-action="canary_abort"]')
    await expect(aborted).to_contain_text("live: v1 → v1 canary aborted")


async def test_a_publisher_follows_and_runs_canaries_from_the_page(
        http_registry: Served, tmp_path: Path) -> None:
    registry = http_registry.harness
    await bot(registry, tmp_path)
    cid = await _start(registry)
    async with _page(http_registry, "publisher") as (page, _):
        card = await _shows_the_canary_live(page, registry, cid)
        await _judged_then_paused_resumed_aborted(page, registry, card, cid)

        # Another canary, started elsewhere, shows up live; promoting it moves the alias.
        second = await _start(registry, version=3)
        card = page.locator(f'[data-testid=canary][data-id="{second}"]')
        await expect(card.get_by_test_id("canary-weight")).to_have_text(
            "v3 takes 10% of live's traffic, v1 the other 90%.")
        promote = card.get_by_test_id("canary-promote")
        await promote.click()
        await expect(promote).to_have_text("confirm: all of live to v3")
        await promote.click()
        await expect(page.get_by_test_id("canary-notice")).to_have_text(
            f"Canary {second} promoted: live now points at v3 "
            f"(promoted by publisher-{OWN}).")
        await expect(page.locator('[data-testid=alias][data-alias="live"]')).to_have_text(
            "live → v3")
        moved = page.locator('[data-testid=timeline-entry][data-action="canary_promote"]')
        await expect(moved).to_have_attribute("data-version", "3")
        await expect(moved).to_contain_text(
            f"live: v1 → v3 promoted by its canary by publisher-{OWN}")
        await expect(page.get_by_test_id("canary")).to_have_count(0)
        assert await alias_version(registry) == 3


async def test_a_refused_action_is_said_in_words(http_registry: Served,
                                                 tmp_path: Path) -> None:
    """Paused behind the page's back (no live feed, so the page still shows it
    progressing): the page's pause is refused with 409, said in words, and the page
    reads the canary again."""
    registry = http_registry.harness
    await bot(registry, tmp_path)
    cid = await _start(registry)
    async with _page(http_registry, "publisher", feed=False) as (page, _):
        card = page.locator('[data-testid=canary][data-alias="live"]')
        await expect(card.get_by_test_id("canary-state")).to_have_text("progressing")
        status, body = await call(registry, "POST", f"{CANARY}/pause")
        assert status == 200, body
        await card.get_by_test_id("canary-pause").click()
        await expect(page.get_by_test_id("canary-notice")).to_have_text(
            f"Not paused: canary {cid} is paused, not progressing (canary_not_progressing)."
            " The page has read the canaries again: check and retry.")
        await expect(page.get_by_test_id("canary-notice")).to_have_class("notice bad")
        await expect(card.get_by_test_id("canary-state")).to_have_text("paused")
        await expect(card.get_by_test_id("canary-resume")).to_be_enabled()


async def _forged(page: Page, verb: str) -> Any:
    """The action as the page's script would send it: its bearer token, from the tab."""
    return await page.evaluate("""async (path) => {
        const token = sessionStorage.getItem("loraplane.token");
        const response = await fetch(path, {
            method: "POST", body: JSON.stringify({ reason: "forged" }),
            headers: { Authorization: `Bearer ${token}`,
                       "Content-Type": "application/json" } });
        return { status: response.status, body: await response.json() };
    }""", f"{CANARY}/{verb}")


async def test_a_reader_sees_the_canary_and_no_button(http_registry: Served,
                                                      tmp_path: Path) -> None:
    registry = http_registry.harness
    await bot(registry, tmp_path)
    cid = await _start(registry)
    async with _page(http_registry, "reader") as (page, _):
        card = page.locator('[data-testid=canary][data-alias="live"]')
        await expect(card.get_by_test_id("canary-state")).to_have_text("progressing")
        await report(registry, "gpu-1", side(cid, "stable", 30), side(cid, "canary", 12))
        await _expect_check(card, "live", "requests", "30", "12", "pass")
        for control in ("pause", "resume", "promote", "abort", "reason-input"):
            await expect(card.get_by_test_id(f"canary-{control}")).to_have_count(0)
        await expect(page.locator("#detail button.action")).to_have_count(0)
        for verb in ("pause", "promote", "abort"):
            refused = await _forged(page, verb)
            assert refused["status"] == 403, refused
            assert refused["body"]["error"]["code"] == "insufficient_role"
        assert await _canary_state(registry) == "progressing"
        await expect(card.get_by_test_id("canary-state")).to_have_text("progressing")
        # At a phone's width the checks scroll in their box; the page does not.
        await page.set_viewport_size({"width": 390, "height": 844})
        await expect(card.get_by_test_id("canary-steps")).to_be_visible()
        assert await scroll_width(page) <= 390
        await screenshot(page, "10-phone-canary")
