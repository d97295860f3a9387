"""Agent status reports and the fleet view over the REST API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from devharness.registry import RegistryHarness
from registry_service.agents.models import AgentRow
from tests.registry.agents.support import (
    age_agent,
    fleet,
    post_status,
    report,
    served,
)
from tests.registry.auth.principals import (
    OTHER,
    OWN,
    Expected,
    assert_error,
    assert_outcome,
    principals,
)

REPORT_STATUS = {
    "agent": Expected(200),
    "global-admin": Expected(200),
    f"admin@{OWN}": Expected(403, "insufficient_role"),
    f"publisher@{OWN}": Expected(403, "insufficient_role"),
    f"reader@{OWN}": Expected(403, "insufficient_role"),
    f"admin@{OTHER}": Expected(403, "insufficient_role"),
    "no-token": Expected(401, "missing_token"),
    "invalid-token": Expected(401, "invalid_token"),
}


async def test_only_agents_and_global_admins_report(registry: RegistryHarness) -> None:
    who = await principals(registry)
    for i, (name, expected) in enumerate(REPORT_STATUS.items()):
        response = await post_status(registry, report(f"gpu-{i}"), who[name])
        assert_outcome(response, expected, name)
        if expected.status == 200:
            body = response.json()
            assert (body["agent_id"], body["base_model"], body["stale"]) == \
                (f"gpu-{i}", "tiny-llama", False)
    assert set(await fleet(registry)) == {"gpu-0", "gpu-1"}


async def test_a_report_replaces_the_previous_one_unless_older(
    registry: RegistryHarness,
) -> None:
    agent = await registry.token("agent")
    # In the past: a report from the future is capped at the registry's clock.
    start = datetime.now(UTC) - timedelta(seconds=60)
    first = report("gpu-1", entries=[served("bot", 1)], time=start)
    assert (await post_status(registry, first, agent)).status_code == 200
    seen = (await fleet(registry))["gpu-1"]
    newer = report("gpu-1", entries=[served("bot", 2)], time=start + timedelta(seconds=5))
    assert (await post_status(registry, newer, agent)).status_code == 200
    after = (await fleet(registry))["gpu-1"]
    assert [s["version"] for s in after["status"]["served"]] == [2]
    assert after["first_seen_at"] == seen["first_seen_at"]
    assert after["last_seen_at"] > seen["last_seen_at"]
    # A retried, older report (or one from a clock running behind) is refused: it
    # neither rolls the status back nor makes the held one look fresh.
    older = report("gpu-1", entries=[served("bot", 1)], time=start + timedelta(seconds=1))
    assert_error(await post_status(registry, older, agent), 409, "stale_report")
    latest = (await fleet(registry))["gpu-1"]
    assert [s["version"] for s in latest["status"]["served"]] == [2]
    assert latest["last_seen_at"] == after["last_seen_at"]
    async with registry.ctx.db.session() as session:
        assert await session.scalar(select(func.count()).select_from(AgentRow)) == 1


async def test_bad_reports_are_refused(registry: RegistryHarness) -> None:
    agent = await registry.token("agent")
    good = report("gpu-1")
    assert_error(await post_status(registry, good, agent, agent_id="gpu-2"), 422,
                 "agent_id_mismatch")
    assert_error(await post_status(registry, report("bad id!"), agent), 422, "invalid_request")
    assert_error(await post_status(registry, report("gpu-1", base_model=""), agent), 422,
                 "invalid_base_model")
    for broken in ({**good, "served": "nope"}, {k: v for k, v in good.items() if k != "time"},
                   {**good, "served": [{"adapter": "bot", "version": 1, "alias": None,
                                        "state": "exploded"}]}):
        assert_error(await post_status(registry, broken, agent, agent_id="gpu-1"), 422,
                     "invalid_request")
    too_many = report("gpu-1", loaded=[f"bot@{i}" for i in range(10_001)])
    assert_error(await post_status(registry, too_many, agent), 422, "status_too_large")
    assert await fleet(registry) == {}


async def test_tenant_readers_see_only_their_adapters_entries(
    registry: RegistryHarness,
) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    await registry.create_adapter("helper", tenant=OTHER)
    who = await principals(registry)
    one = report("gpu-1", entries=[served("bot", 1), served("helper", 2), served("ghost", 1)],
                 failures=[served("bot", 3, "canary", "failed", reason="rank 64 > 16", code="rank"),
                           served("helper", 4, None, "failed", reason="nan", code="nan")],
                 loaded=["bot@1", "helper@2", "ghost@1"])
    two = report("gpu-2", base_model="other-model", entries=[served("helper", 2)])
    # An agent token reports for one agent; the global admin may report for any.
    assert (await post_status(registry, one, who["agent"])).status_code == 200
    assert (await post_status(registry, two)).status_code == 200

    def entries(view: dict[str, dict[str, object]], agent: str) -> tuple[object, ...]:
        status = view[agent]["status"]
        assert isinstance(status, dict)
        return (sorted(s["adapter"] for s in status["served"]),
                sorted(f["adapter"] for f in status["failures"]), sorted(status["loaded"]))

    for name in ("global-admin", "agent"):
        view = await fleet(registry, who[name])
        assert entries(view, "gpu-1") == (["bot", "ghost", "helper"], ["bot", "helper"],
                                          ["bot@1", "ghost@1", "helper@2"])
    for role in ("reader", "publisher", "admin"):
        own = await fleet(registry, who[f"{role}@{OWN}"])
        assert set(own) == {"gpu-1", "gpu-2"}
        assert entries(own, "gpu-1") == (["bot"], ["bot"], ["bot@1"])
        assert entries(own, "gpu-2") == ([], [], [])
        other = await fleet(registry, who[f"{role}@{OTHER}"])
        assert entries(other, "gpu-1") == (["helper"], ["helper"], ["helper@2"])
        assert entries(other, "gpu-2") == (["helper"], [], [])
    assert set(await fleet(registry, base_model="other-model")) == {"gpu-2"}
    for name, code in (("no-token", "missing_token"), ("invalid-token", "invalid_token")):
        assert_error(await registry.client.get("/v1/agents", headers=who[name]), 401, code)


async def test_agents_not_seen_for_a_while_are_stale(registry: RegistryHarness) -> None:
    agent = await registry.token("agent")
    assert (await post_status(registry, report("gpu-old"), agent)).status_code == 200
    other = await registry.token("agent")
    assert (await post_status(registry, report("gpu-new"), other)).status_code == 200
    await age_agent(registry, "gpu-old", 600)
    view = await fleet(registry)
    assert (view["gpu-old"]["stale"], view["gpu-new"]["stale"]) == (True, False)
    assert view["gpu-old"]["seconds_since_seen"] >= 600
    relaxed = await fleet(registry, stale_after_s="3600")
    assert (relaxed["gpu-old"]["stale"], relaxed["gpu-new"]["stale"]) == (False, False)
    # A fresh report makes it current again.
    assert (await post_status(registry, report("gpu-old"), agent)).status_code == 200
    assert (await fleet(registry))["gpu-old"]["stale"] is False
    for bad in ("0", "-1", "soon"):
        response = await registry.client.get("/v1/agents", params={"stale_after_s": bad},
                                             headers=registry.admin_headers)
        assert_error(response, 422, "invalid_request")


async def test_a_report_asked_for_minimal_is_stored_and_answered_without_a_body(
    registry: RegistryHarness,
) -> None:
    token = await registry.token("agent")
    # RFC 7240: a list of preferences, parameters after ';', any case.
    for prefer, version in (("return=minimal", 1), ("respond-async, Return=Minimal; x=1", 2)):
        body = report("gpu-1", entries=[served("bot", version)],
                      time=datetime.now(UTC) - timedelta(seconds=60 - version))
        response = await post_status(registry, body, {**token, "Prefer": prefer})
        assert response.status_code == 204 and response.content == b""
        assert response.headers["Preference-Applied"] == "return=minimal"
        stored = (await fleet(registry))["gpu-1"]
        assert [s["version"] for s in stored["status"]["served"]] == [version]
    # Without it, or with another return preference, the stored agent comes back.
    answered = await post_status(registry, report("gpu-1"),
                                 {**token, "Prefer": "return=representation"})
    assert answered.status_code == 200 and answered.json()["agent_id"] == "gpu-1"
