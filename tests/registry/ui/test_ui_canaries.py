"""``/ui/api/canaries``: the running canaries the page shows, cut to the token's tenant, with
the current step's checks so far; and the page's actions, which are the registry's own
canary routes: a reader's call, forged as the page would send it, is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir
from tests.registry.auth.principals import assert_error
from tests.registry.canaries.support import ANALYSIS, CANARY, bot, call, report, side
from tests.registry.ui.support import OTHER, OWN

RIVAL_CANARY = "/v1/adapters/rival/aliases/live/canary"


async def _rival(registry: RegistryHarness, tmp_path: Path) -> int:
    """``rival`` of OTHER, ``live`` on v1, a canary of v2 running on it."""
    await registry.create_adapter("rival", tenant=OTHER)
    for seed in (1, 2):
        response = await upload_dir(registry, "rival",
                                    make_adapter(tmp_path / f"rival{seed}", seed=10 + seed),
                                    aliases="live" if seed == 1 else "")
        assert response.status_code == 201, response.text
    status, canary = await call(registry, "POST", RIVAL_CANARY,
                                json={"version": 2, "steps": [5, 25, 75]})
    assert status == 201, canary
    return int(canary["id"])


async def _two_tenants(registry: RegistryHarness, tmp_path: Path) -> tuple[int, int]:
    """``bot`` of OWN with a canary of v2 on ``live`` (10 → 50), seen by traffic; and
    ``rival`` of OTHER with one of its own."""
    await bot(registry, tmp_path)
    status, canary = await call(registry, "POST", CANARY, json={
        "version": 2, "steps": [10, 50], "step_seconds": 600, "analysis": ANALYSIS})
    assert status == 201, canary
    cid = int(canary["id"])
    await report(registry, "gpu-1", side(cid, "stable", 90), side(cid, "canary", 30, errors=3))
    return cid, await _rival(registry, tmp_path)


async def _running(registry: RegistryHarness, headers: dict[str, str]) -> list[dict[str, Any]]:
    response = await registry.client.get("/ui/api/canaries", headers=headers)
    assert response.status_code == 200, response.text
    canaries: list[dict[str, Any]] = response.json()["canaries"]
    return canaries


async def test_canaries_are_the_tenants_own_with_their_checks_so_far(
        registry: RegistryHarness, tmp_path: Path) -> None:
    cid, rid = await _two_tenants(registry, tmp_path)
    [own] = await _running(registry, await registry.token("reader", OWN))
    assert {k: own[k] for k in ("id", "adapter", "alias", "stable_version", "canary_version",
                                "state", "step", "weight", "steps", "checks")} == {
        "id": cid, "adapter": "bot", "alias": "live", "stable_version": 1,
        "canary_version": 2, "state": "progressing", "step": 1, "weight": 10,
        "steps": [10, 50], "checks": []}
    live = {c["metric"]: c for c in own["live_checks"]}
    assert (live["requests"]["stable"], live["requests"]["canary"],
            live["requests"]["verdict"]) == (90, 30, "pass")
    assert (live["error_rate"]["canary"], live["error_rate"]["verdict"]) == (0.1, "fail")
    # The same as the canary route says of it.
    status, read = await call(registry, "GET", CANARY)
    assert status == 200 and read == own

    [other] = await _running(registry, await registry.token("reader", OTHER))
    assert (other["id"], other["adapter"], other["steps"]) == (rid, "rival", [5, 25, 75])
    every = await _running(registry, registry.admin_headers)
    assert [(c["adapter"], c["id"]) for c in every] == [("bot", cid), ("rival", rid)]

    # An ended canary leaves the list; the other tenant's stays.
    assert (await call(registry, "POST", f"{CANARY}/abort"))[0] == 200
    assert await _running(registry, await registry.token("publisher", OWN)) == []
    assert [c["id"] for c in await _running(registry, registry.admin_headers)] == [rid]


async def test_canaries_need_a_readers_token(registry: RegistryHarness,
                                             tmp_path: Path) -> None:
    await bot(registry, tmp_path)
    assert_error(await registry.client.get("/ui/api/canaries"), 401, "missing_token")
    assert_error(await registry.client.get("/ui/api/canaries",
                                           headers=await registry.token("inference", OWN)),
                 403, "insufficient_role")


async def test_a_readers_forged_action_is_refused(registry: RegistryHarness,
                                                  tmp_path: Path) -> None:
    """The page offers a reader no button; the same call sent anyway, with the page's
    bearer token, is refused by the registry (and another tenant's is not found)."""
    cid, _ = await _two_tenants(registry, tmp_path)
    reader = await registry.token("reader", OWN)
    other_publisher = await registry.token("publisher", OTHER)
    for verb in ("pause", "resume", "promote", "abort"):
        forged = await registry.client.post(f"{CANARY}/{verb}", json={"reason": "forged"},
                                            headers=reader)
        assert_error(forged, 403, "insufficient_role")
        assert_error(await registry.client.post(f"{CANARY}/{verb}", headers=other_publisher),
                     404, "adapter_not_found")
    [still] = await _running(registry, reader)
    assert (still["id"], still["state"], still["reason"]) == (
        cid, "progressing", "started by bootstrap-admin: version 2 on 10% of 'live'")
    # No cookie is set or honoured: without the bearer header there is no caller.
    assert_error(await registry.client.post(f"{CANARY}/pause"), 401, "missing_token")
    publisher = await registry.token("publisher", OWN)
    paused = await registry.client.post(f"{CANARY}/pause", json={"reason": "mine"},
                                        headers=publisher)
    assert paused.status_code == 200, paused.text
    [after] = await _running(registry, reader)
    assert (after["state"], after["reason"]) == ("paused", f"paused by publisher-{OWN}: mine")
