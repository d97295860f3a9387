"""Events acted on without a registry read, and the reads that remain (a gap, an
unknown adapter or alias, a deletion, a placement change), through the real reconciler,
work queue and placement; the registry, swap and cache are test_reconciler.py's fakes.
The registry is asked only what changed, and only when the events cannot say."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from inference_agent.control.workqueue import Done
from loraplane.events import (
    AdapterDeleted,
    AdapterUpdated,
    CanaryRoute,
    FleetChanged,
    PlacementChanged,
    VersionPublished,
    VersionRef,
)
from loraplane.placement import owners
from tests.agent.control.test_placement import ADAPTERS, placed_world, resync
from tests.agent.control.test_reconciler import BASE, World, ref


def _common(adapter: str, tenant: str = "acme") -> dict[str, object]:
    return {"event_id": str(uuid.uuid4()), "seq": 1, "time": datetime.now(UTC),
            "tenant": tenant, "adapter": adapter}


def moved(adapter: str, alias: str, revision: int, target: VersionRef | None,
          tenant: str = "acme") -> AdapterUpdated:
    return AdapterUpdated(**_common(adapter, tenant), alias=alias, revision=revision,
                          action="promote" if target else "delete", base_model=BASE,
                          version=target.version if target else None, previous_version=None,
                          digest=target.digest if target else None,
                          rank=target.rank if target else None,
                          files=target.files if target else [], target=target)


async def drain(w: World) -> list[str]:
    """Reconcile every queued key, as the agent's workers would; the keys, in order."""
    keys: list[str] = []
    while len(w.queue):
        key = await w.queue.get()
        assert key is not None
        keys.append(key)
        assert isinstance(await w.reconciler.reconcile(key), Done)
        w.queue.done(key)
    return keys


async def synced() -> World:
    w = World()
    w.registry.move("bot", "live", ref("bot", 1))
    await w.reconciler.resync_all()
    await drain(w)
    w.registry.calls.clear()
    return w


async def test_the_next_revision_is_applied_from_the_event_alone() -> None:
    w = await synced()
    w.registry.move("bot", "live", ref("bot", 2))
    w.reconciler.on_event(moved("bot", "live", 2, ref("bot", 2)))
    assert await drain(w) == ["bot"]
    assert w.serving("bot") == {"live": 2}
    assert w.registry.calls == [], "the event carried everything: no registry read"
    # A second alias removed and set again: each the next revision, each applied.
    w.reconciler.on_event(moved("bot", "live", 3, None))
    await drain(w)
    assert w.serving("bot") == {}
    w.reconciler.on_event(moved("bot", "live", 4, ref("bot", 4)))
    await drain(w)
    assert w.serving("bot") == {"live": 4}
    assert w.registry.calls == []
    assert w.reconciler.mirror.counts.applied == 3


async def test_a_canary_event_splits_the_alias_without_a_registry_read() -> None:
    w = await synced()
    canary = CanaryRoute(id=3, weight=40, target=ref("bot", 2))
    w.reconciler.on_event(moved("bot", "live", 2, ref("bot", 1)).model_copy(
        update={"action": "canary_start", "canary": canary}))
    assert await drain(w) == ["bot"]
    assert w.routes.canary("bot", "live") == canary and w.serving("bot") == {"live": 1}
    assert w.registry.calls == [], "the event carried the canary: no registry read"
    w.reconciler.on_event(moved("bot", "live", 3, ref("bot", 1)).model_copy(
        update={"action": "canary_abort"}))
    await drain(w)
    assert w.routes.canary("bot", "live") is None and w.registry.calls == []


async def test_duplicate_and_late_events_change_nothing() -> None:
    w = await synced()
    event = moved("bot", "live", 2, ref("bot", 2))
    w.reconciler.on_event(event)
    await drain(w)
    w.swapper.moves.clear()
    w.reconciler.on_event(event)  # redelivered
    w.reconciler.on_event(moved("bot", "live", 1, ref("bot", 1)))  # late
    assert len(w.queue) == 0, "nothing to do: not even queued"
    assert await drain(w) == [] and w.swapper.moves == []
    assert w.serving("bot") == {"live": 2} and w.registry.calls == []
    assert w.reconciler.mirror.counts.ignored == 2


async def test_a_gap_reads_that_adapter_only() -> None:
    w = await synced()
    w.registry.move("bot", "live", ref("bot", 2))
    w.registry.move("bot", "live", ref("bot", 3))
    # Revision 2 was never seen here: the event for 3 cannot be trusted.
    w.reconciler.on_event(moved("bot", "live", 3, ref("bot", 3)))
    await drain(w)
    assert w.registry.calls == ["bot"]
    assert w.serving("bot") == {"live": 3}
    # Then the mirror is whole again: the next move needs no read.
    w.registry.move("bot", "live", ref("bot", 4))
    w.reconciler.on_event(moved("bot", "live", 4, ref("bot", 4)))
    await drain(w)
    assert w.registry.calls == ["bot"] and w.serving("bot") == {"live": 4}


async def test_unknown_adapters_aliases_and_tenants_are_read() -> None:
    w = await synced()
    w.registry.move("new", "live", ref("new", 1))
    w.reconciler.on_event(moved("new", "live", 1, ref("new", 1)))
    # An alias the mirror holds no revision for may have been removed at any revision.
    w.registry.move("bot", "canary", ref("bot", 1))
    w.reconciler.on_event(moved("bot", "canary", 1, ref("bot", 1)))
    await drain(w)
    assert sorted(c or "" for c in w.registry.calls) == ["bot", "new"]
    assert w.serving("new") == {"live": 1} and w.serving("bot") == {"live": 1, "canary": 1}
    w.registry.calls.clear()
    # The same name under another tenant is not this adapter's next move.
    w.reconciler.on_event(moved("bot", "live", 2, ref("bot", 9), tenant="other"))
    await drain(w)
    assert w.registry.calls == ["bot"] and w.serving("bot") == {"live": 1, "canary": 1}


async def test_publishes_queue_nothing_and_deletions_and_placements_read() -> None:
    w = await synced()
    w.reconciler.on_event(VersionPublished(**_common("bot"), base_model=BASE,
                                           target=ref("bot", 2)))
    assert len(w.queue) == 0
    w.reconciler.on_event(PlacementChanged(**_common("bot"), base_model=BASE,
                                           replicas=1))
    await drain(w)
    assert w.registry.calls == ["bot"]
    del w.registry.adapters["bot"]
    w.reconciler.on_event(AdapterDeleted(**_common("bot"), base_model=BASE))
    await drain(w)
    assert w.registry.calls == ["bot", "bot"] and w.serving("bot") == {}


async def test_a_resync_still_repairs_what_no_event_told() -> None:
    w = await synced()
    w.registry.move("bot", "live", ref("bot", 2))  # its event was lost
    await drain(w)
    assert w.serving("bot") == {"live": 1}
    await w.reconciler.resync_all()
    await drain(w)
    assert w.serving("bot") == {"live": 2}


async def test_a_fleet_event_re_places_without_reads_and_moves_only_new_owners() -> None:
    fleet = ["agent-a", "agent-b", "agent-c"]
    w = placed_world("agent-a", fleet)
    await resync(w)
    before = set(w.reconciler.placement.owned())
    assert before == {n for n in ADAPTERS if owners(fleet, n, 1) == ["agent-a"]}
    w.registry.calls.clear()
    smaller = ["agent-a", "agent-c"]  # agent-b left
    # After the snapshot (the fake registry's event seq is 7), as the stream has it.
    after_snapshot = {**_common("", tenant="_fleet"), "seq": 8}
    w.reconciler.on_event(FleetChanged(**after_snapshot, base_model=BASE, agents=smaller,
                                       left=["agent-b"]))
    await drain(w)
    assert w.registry.calls == [], "the event carried the fleet: no registry read"
    after = w.reconciler.placement.owned()
    assert after == {n for n in ADAPTERS if owners(smaller, n, 1) == ["agent-a"]}
    gained = after - before
    assert before <= after, "nothing moves away from an agent that stays"
    assert gained == {n for n in ADAPTERS if owners(fleet, n, 1) == ["agent-b"]
                      and owners(smaller, n, 1) == ["agent-a"]}
    assert gained and all(f"{n}@1" in w.cache.loaded for n in gained)
    # Another base model's fleet is not ours.
    w.reconciler.on_event(FleetChanged(**_common("", tenant="_fleet"),
                                       base_model="other", agents=["agent-z"]))
    assert len(w.queue) == 0
