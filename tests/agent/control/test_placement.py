"""Placement in the reconciler: an agent pins and loads the adapters it owns, leaves the
rest to load on demand, and a fleet change touches only the adapters whose owners moved.

Real RouteTable, WorkQueue and placement function; the registry, swap and cache are the
narrow fakes of test_reconciler.py (the e2e test runs it against real vLLM)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from inference_agent.control.keys import ALL, key_for
from inference_agent.control.placement import Placement
from inference_agent.control.reconciler import Reconciler
from inference_agent.control.workqueue import Done
from loraplane.events import (
    FLEET_TENANT,
    DesiredState,
    FleetChanged,
    PlacementChanged,
    parse_event,
)
from loraplane.placement import owners
from tests.agent.control.test_reconciler import BASE, FakeRegistry, World, ref
from tests.agent.loop_support import FakeCache

ADAPTERS = [f"bot-{i}" for i in range(40)]


class PlacedRegistry(FakeRegistry):
    """The fake registry, with a placement setting per adapter and a live fleet."""

    def __init__(self) -> None:
        super().__init__()
        self.replicas: dict[str, int | None] = {}
        self.agents: list[str] = []

    async def desired(self, base_model: str, adapter: str | None = None) -> DesiredState:
        state = await super().desired(base_model, adapter)
        adapters = [a.model_copy(update={"replicas": self.replicas.get(a.name)})
                    for a in state.adapters]
        return state.model_copy(update={"adapters": adapters, "agents": list(self.agents)})


def placed_world(agent_id: str, fleet: list[str], pins: tuple[str, ...] = ()) -> World:
    w = World(pins=pins)
    registry = PlacedRegistry()
    registry.agents = fleet
    for name in ADAPTERS:
        registry.move(name, "live", ref(name, 1))
        registry.replicas[name] = 1
    registry.move("everywhere", "live", ref("everywhere", 1))  # no placement setting
    w.registry = registry
    w.reconciler = Reconciler(
        base_model=BASE, registry=registry, routes=w.routes, swapper=w.swapper,
        cache=w.cache, queue=w.queue, metrics=w.metrics, max_attempts=3, pins=pins,
        agent_id=agent_id)
    w.reconciler.pin_configured()
    return w


async def resync(w: World) -> None:
    """A periodic resync: the snapshot (with the fleet), then every adapter's key."""
    assert isinstance(await w.reconciler.reconcile(ALL), Done)
    for name in [*ADAPTERS, "everywhere"]:
        assert isinstance(await w.reconciler.reconcile(name), Done)


def mine(agent_id: str, fleet: list[str]) -> set[str]:
    return {name for name in ADAPTERS if agent_id in owners(fleet, name, 1)}


async def test_an_agent_keeps_hot_exactly_what_it_owns() -> None:
    fleet = ["a1", "a2", "a3"]
    w = placed_world("a1", fleet)
    await resync(w)
    expected = mine("a1", fleet)
    assert 0 < len(expected) < len(ADAPTERS)
    assert w.cache.pinned == expected
    assert w.reconciler.placement.owned() == expected
    assert set(w.cache.loaded) == {f"{name}@1" for name in expected}
    # Everything is still routed here: the rest loads at its first request.
    assert set(w.routes.adapters()) == {*ADAPTERS, "everywhere"}
    # What the swap was asked to do before each flip: load what this agent owns, fetch
    # nothing of what it neither owns nor serves, and fetch the unplaced adapter.
    assert w.swapper.readiness == {
        **{(name, 1): "hot" if name in expected else "cold" for name in ADAPTERS},
        ("everywhere", 1): "warm"}
    before = list(w.cache.loaded)
    await resync(w)
    assert w.cache.pinned == expected, "a resync with the same fleet changes nothing"
    # Kept hot: each owned version is checked again (a no-op on a loaded one).
    assert sorted(w.cache.loaded[len(before):]) == sorted(f"{n}@1" for n in expected)


async def test_a_join_and_a_leave_move_only_the_adapters_whose_owners_change() -> None:
    w = placed_world("a1", ["a1", "a2", "a3"])
    await resync(w)
    placement = w.reconciler.placement
    owned_before = placement.owned()
    w.registry.agents = ["a1", "a2", "a3", "a4"]  # type: ignore[attr-defined]
    await resync(w)
    taken = owned_before - mine("a1", ["a1", "a2", "a3", "a4"])
    assert placement.owned() == owned_before - taken
    assert (placement.gained, placement.lost) == (len(owned_before), len(taken))
    w.cache.loaded.clear()
    w.registry.agents = ["a1", "a3", "a4"]  # type: ignore[attr-defined]
    await resync(w)
    now = mine("a1", ["a1", "a3", "a4"])
    gained = now - (owned_before - taken)
    assert placement.owned() == now == w.cache.pinned
    assert placement.gained == len(owned_before) + len(gained)
    # Only the newly owned adapters load for the first time; the rest were loaded already
    # (the fake cache records every ensure_active, kept or new).
    assert {n.partition("@")[0] for n in w.cache.loaded} == now
    assert gained == {n for n in ADAPTERS if owners(["a1", "a2", "a3", "a4"], n, 1) == ["a2"]
                      and owners(["a1", "a3", "a4"], n, 1) == ["a1"]}


async def test_a_configured_pin_outlives_losing_ownership() -> None:
    cache = FakeCache()
    placement = Placement("a1", cache, configured=["bot-1"])
    placement.set_fleet(["a1"])
    assert placement.place("bot-1", 1) and placement.place("bot-2", 1)
    assert cache.pinned == {"bot-1", "bot-2"}
    # The placement setting cleared: neither is owned any more.
    assert not placement.place("bot-1", None) and not placement.place("bot-2", None)
    assert placement.owned() == set()
    assert cache.pinned == {"bot-1"}, "--pin keeps it whatever placement says"


async def test_an_agent_alone_or_not_yet_listed_owns_its_share() -> None:
    w = placed_world("new", [])  # the registry has no report from it yet
    await resync(w)
    assert w.reconciler.placement.owned() == set(ADAPTERS)


def test_a_placement_event_queues_its_adapter_of_this_base_model_only() -> None:
    raw = {"type": "placement_changed", "event_id": "e", "seq": 1,
           "time": "2026-11-23T20:00:00+00:00", "tenant": "acme", "adapter": "bot",
           "base_model": BASE, "replicas": 2}
    event = parse_event(json.dumps(raw))
    assert isinstance(event, PlacementChanged) and event.replicas == 2
    assert key_for(event, BASE) == "bot"
    assert key_for(event, "other-model") is None


def fleet_event(seq: int, agents: list[str]) -> FleetChanged:
    return FleetChanged(event_id=f"fleet-{seq}", seq=seq, time=datetime.now(UTC),
                        tenant=FLEET_TENANT, adapter="", base_model=BASE, agents=agents)


async def run_queue(w: World) -> None:
    while len(w.queue):
        key = await w.queue.get()
        assert key is not None
        assert isinstance(await w.reconciler.reconcile(key), Done)
        w.queue.done(key)


async def test_a_fleet_event_older_than_the_fleet_held_changes_nothing() -> None:
    w = placed_world("a1", ["a1"])
    await resync(w)  # the snapshot, at event seq 7: a1 alone owns everything
    placement = w.reconciler.placement
    assert placement.owned() == set(ADAPTERS)
    three, two = ["a1", "a2", "a3"], ["a1", "a2"]
    assert mine("a1", three) != mine("a1", two)
    # The relay published the newer event first; the older one comes after it.
    w.reconciler.on_event(fleet_event(9, three))
    w.reconciler.on_event(fleet_event(8, two))
    await run_queue(w)
    assert placement.owned() == mine("a1", three) == w.cache.pinned
    w.reconciler.on_event(fleet_event(6, ["a1"]))  # older than the snapshot, too
    assert len(w.queue) == 0 and placement.owned() == mine("a1", three)
    # A newer one is taken; so is a full resync's fleet, whatever its number (the
    # registry's history may have restarted).
    w.reconciler.on_event(fleet_event(10, two))
    await run_queue(w)
    assert placement.owned() == mine("a1", two)
    w.registry.agents = three  # type: ignore[attr-defined]
    await resync(w)
    assert placement.owned() == mine("a1", three)
