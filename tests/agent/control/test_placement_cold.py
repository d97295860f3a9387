"""Adapters an agent neither owns nor serves stay cold: an alias move of an adapter
placed on other agents downloads nothing, and its first request fetches and loads it.
An adapter without a placement setting is still fetched before its flip, and an owned
one still loaded before it.

The reconciler runs with the real Swapper, AdapterCache and Materializer in front of a
narrow fake vLLM (tests/agent/adapter_refs.py); the fetch copies local files and counts
what it copies, so a download is a counted call.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest

from devharness.waiting import eventually
from inference_agent.control.keys import ALL
from inference_agent.control.reconciler import Reconciler
from inference_agent.control.swap import Swapper
from inference_agent.control.workqueue import Done, Failed, WorkQueue
from inference_agent.metrics import AgentMetrics
from inference_agent.node.cache import AdapterCache
from inference_agent.node.materialize import Materializer
from inference_agent.node.status import tier_entries
from inference_agent.node.vllm_client import VllmClient
from inference_agent.serving.routes import RouteTable, Target
from loraplane.events import Tier, VersionRef
from loraplane.placement import owners
from tests.agent.adapter_refs import FakeVllm, LocalFetch, WatchedLeases, adapter_ref
from tests.agent.control.test_placement import PlacedRegistry
from tests.agent.control.test_reconciler import BASE

FLEET = ["a1", "a2"]  # this agent is a1


def placed_on(agent_id: str) -> str:
    """An adapter name that rendezvous hashing gives to ``agent_id`` alone."""
    return next(name for i in range(100) if owners(FLEET, name := f"bot-{i}", 1) == [agent_id])


class Host:
    """Agent a1 of a two-agent fleet, with the real swap, cache and disk cache."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.vllm = FakeVllm()
        self.fetch = LocalFetch()
        self.metrics = AgentMetrics()
        self.materializer = Materializer(root / "cache", max_bytes=10**9, fetch=self.fetch,
                                         base_shapes=None, max_rank=16, metrics=self.metrics)
        self.routes = RouteTable(BASE)
        leases = WatchedLeases()
        self.cache = AdapterCache(cast(VllmClient, self.vllm), self.materializer, leases,
                                  capacity=4, metrics=self.metrics, load_wait_timeout_s=1,
                                  is_routed=self.routes.is_routed)
        swapper = Swapper(self.routes, self.cache, leases, self.materializer,
                          drain_timeout_s=5, metrics=self.metrics)
        self.registry = PlacedRegistry()
        self.registry.agents = list(FLEET)
        self.reconciler = Reconciler(
            base_model=BASE, registry=self.registry, routes=self.routes, swapper=swapper,
            cache=self.cache, queue=WorkQueue(), metrics=self.metrics, max_attempts=3,
            agent_id="a1", max_loaded=4)
        self.refs: dict[tuple[str, int], VersionRef] = {}

    def push(self, name: str, version: int, replicas: int | None, **make: object) -> None:
        ref = adapter_ref(self.root, name, version, **make)
        if "rank" in make:  # what the registry would say of such a version
            ref = ref.model_copy(update={"rank": make["rank"]})
        self.refs[(name, version)] = ref
        self.registry.move(name, "live", ref)
        self.registry.replicas[name] = replicas

    def fetched(self, name: str, version: int) -> int:
        """Files of ``name@version`` downloaded so far."""
        urls = {f.url for f in self.refs[(name, version)].files}
        return sum(url in urls for url in self.fetch.calls)

    def serving(self, name: str) -> int:
        return self.routes.aliases(name)["live"][1].version

    def tier(self, name: str, version: int) -> Tier:
        entries = tier_entries(routes=self.routes, loaded=self.cache.loaded_names(),
                               on_disk=self.materializer.on_disk(),
                               owned=self.reconciler.placement.owned())
        return next(e.tier for e in entries if (e.adapter, e.version) == (name, version))

    async def request(self, name: str) -> str:
        """What the proxy does with a request for ``name``: resolve, then ensure_active."""
        target = self.routes.resolve(name, {}, "acme")
        assert isinstance(target, Target) and target.ref is not None
        return await self.cache.ensure_active(target.ref)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


async def test_an_adapter_placed_elsewhere_moves_without_a_download(host: Host) -> None:
    name = placed_on("a2")
    host.push(name, 1, replicas=1)
    assert isinstance(await host.reconciler.reconcile(ALL), Done)  # start-up: the snapshot
    assert isinstance(await host.reconciler.reconcile(name), Done)
    assert host.serving(name) == 1 and name not in host.reconciler.placement.owned()
    assert host.fetch.calls == [] and host.tier(name, 1) == "cold"
    host.push(name, 2, replicas=1)  # the alias moves: still nothing fetched
    host.reconciler.notify(name)
    assert isinstance(await host.reconciler.reconcile(name), Done)
    assert host.serving(name) == 2
    assert host.fetch.calls == [] and host.vllm.load_calls == []
    assert host.tier(name, 2) == "cold"
    # Its first request fetches, verifies and loads the version it is routed to.
    assert await host.request(name) == f"{name}@2"
    assert host.fetched(name, 2) == len(host.refs[(name, 2)].files)
    assert host.fetched(name, 1) == 0, "the version it moved past was never fetched"
    assert host.vllm.load_calls == [f"{name}@2"] and host.tier(name, 2) == "hot"
    # Now hot here: its next version loads before the flip, like any hot adapter.
    host.push(name, 3, replicas=1)
    host.reconciler.notify(name)
    assert isinstance(await host.reconciler.reconcile(name), Done)
    assert host.serving(name) == 3 and host.cache.is_active(f"{name}@3")


async def test_a_cold_move_still_refuses_what_needs_no_download(host: Host) -> None:
    name = placed_on("a2")
    host.push(name, 1, replicas=1, rank=32)  # above the agent's max rank of 16
    await host.reconciler.reconcile(ALL)
    outcome = await host.reconciler.reconcile(name)
    assert isinstance(outcome, Failed) and "rank" in outcome.reason
    assert name not in host.routes.adapters() and host.fetch.calls == []


async def test_an_unplaced_adapter_is_fetched_before_its_flip(host: Host) -> None:
    host.push("everywhere", 1, replicas=None)
    await host.reconciler.reconcile(ALL)
    assert isinstance(await host.reconciler.reconcile("everywhere"), Done)
    assert host.fetched("everywhere", 1) == 2 and host.tier("everywhere", 1) == "warm"
    host.push("everywhere", 2, replicas=None)
    host.reconciler.notify("everywhere")
    assert isinstance(await host.reconciler.reconcile("everywhere"), Done)
    assert host.fetched("everywhere", 2) == 2 and host.tier("everywhere", 2) == "warm"
    assert host.vllm.load_calls == [], "fetched, not loaded: it loads on demand"


async def test_an_owned_adapter_loads_before_the_flip(host: Host) -> None:
    name = placed_on("a1")
    host.push(name, 1, replicas=1)
    await host.reconciler.reconcile(ALL)
    assert isinstance(await host.reconciler.reconcile(name), Done)
    assert host.cache.is_active(f"{name}@1") and host.tier(name, 1) == "hot"
    host.push(name, 2, replicas=1)
    host.reconciler.notify(name)
    host.vllm.gate = asyncio.Event()  # hold the load of version 2 open
    move = asyncio.create_task(host.reconciler.reconcile(name))
    await eventually(lambda: f"{name}@2" in host.vllm.load_calls, what="the load started")
    assert host.serving(name) == 1, "the alias waits for the load"
    host.vllm.gate.set()
    assert isinstance(await move, Done)
    assert host.serving(name) == 2 and host.cache.is_active(f"{name}@2")
