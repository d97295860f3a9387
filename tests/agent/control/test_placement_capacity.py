"""An agent that owns more adapters than it can keep hot.

Pinned versions are never evicted, so an agent pinning every adapter it owns past its
``--max-loaded`` would leave no slot for anything: every on-demand load (its other
owned adapters' and everyone else's) would answer ``capacity_exhausted``, and retrying
would not help. Placement pins at most ``--max-loaded - 1 - len(--pin)`` owned
adapters; the rest are *over capacity*: reported, counted, loaded on demand, and kept
hot as soon as a slot frees. A kept adapter whose load fails for a passing reason is
retried with its key's backoff.

The reconciler runs here with a real AdapterCache and Materializer in front of a narrow
fake vLLM (tests/agent/adapter_refs.py), so the slots are the cache's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from inference_agent.control.keys import ALL
from inference_agent.control.placement import Placement
from inference_agent.control.reconciler import Reconciler
from inference_agent.control.workqueue import Done, Retry, WorkQueue
from inference_agent.errors import VllmUnavailable
from inference_agent.metrics import AgentMetrics
from inference_agent.node.cache import AdapterCache
from inference_agent.node.materialize import Materializer
from inference_agent.node.status import tier_entries
from inference_agent.node.vllm_client import VllmClient
from inference_agent.serving.routes import RouteTable
from loraplane.events import VersionRef
from tests.agent.adapter_refs import FakeVllm, LocalFetch, WatchedLeases, adapter_ref
from tests.agent.control.test_placement import PlacedRegistry
from tests.agent.control.test_reconciler import BASE
from tests.agent.loop_support import FakeCache, FakeSwapper

OWNED = [f"own-{i}" for i in range(5)]
GAUGE = "loraplane_agent_owned_adapters"


class Host:
    """One agent alone in its fleet (it owns every placed adapter), ``--max-loaded 3``."""

    def __init__(self, root: Path, capacity: int = 3, pins: tuple[str, ...] = ()) -> None:
        self.root = root
        self.vllm = FakeVllm()
        self.metrics = AgentMetrics()
        self.materializer = Materializer(root / "cache", max_bytes=10**9, fetch=LocalFetch(),
                                         base_shapes=None, max_rank=16, metrics=self.metrics)
        self.routes = RouteTable(BASE)
        self.cache = AdapterCache(cast(VllmClient, self.vllm), self.materializer,
                                  WatchedLeases(), capacity=capacity, metrics=self.metrics,
                                  load_wait_timeout_s=0.5, is_routed=self.routes.is_routed)
        self.queue: WorkQueue[str] = WorkQueue()
        self.registry = PlacedRegistry()
        self.registry.agents = ["solo"]
        self.reconciler = Reconciler(
            base_model=BASE, registry=self.registry, routes=self.routes,
            swapper=FakeSwapper(self.routes), cache=self.cache, queue=self.queue,
            metrics=self.metrics, max_attempts=3, pins=pins, agent_id="solo",
            max_loaded=capacity)
        self.reconciler.pin_configured()
        self.refs: dict[str, VersionRef] = {}

    def publish(self, name: str, replicas: int | None) -> None:
        self.refs[name] = adapter_ref(self.root, name, 1)
        self.registry.move(name, "live", self.refs[name])
        self.registry.replicas[name] = replicas

    async def run_queue(self) -> list[object]:
        """Reconcile every queued key, as the workers would, until none is left."""
        outcomes: list[object] = []
        while len(self.queue):
            key = await self.queue.get()
            assert key is not None
            outcomes.append(await self.reconciler.reconcile(key))
            self.queue.done(key)
        return outcomes

    def gauge(self, state: str) -> float | None:
        return self.metrics.registry.get_sample_value(GAUGE, {"state": state})


async def settled(root: Path, **kwargs: object) -> Host:
    host = Host(root, **kwargs)  # type: ignore[arg-type]
    for name in OWNED:
        host.publish(name, 1)
    host.publish("elsewhere", None)  # no placement: on demand everywhere
    await host.reconciler.reconcile(ALL)
    assert all(isinstance(o, Done) for o in await host.run_queue())
    return host


async def test_owned_past_the_slots_are_over_capacity_and_load_on_demand(
        tmp_path: Path) -> None:
    host = await settled(tmp_path)
    placement = host.reconciler.placement
    assert placement.slots == 2  # --max-loaded 3, one slot kept for on-demand loads
    kept = placement.kept()
    assert kept == {"own-0", "own-1"}, "the first two reconciled (in name order)"
    assert placement.owned() == set(OWNED)
    assert placement.over_capacity() == set(OWNED) - kept
    assert host.cache.pinned() == kept
    assert set(host.vllm.names) == {f"{n}@1" for n in kept}
    assert (host.gauge("kept_hot"), host.gauge("over_capacity")) == (2, 3)
    # The free slot serves every on-demand load, owned past capacity or not placed.
    for name in ("own-4", "elsewhere", "own-3"):
        assert await host.cache.ensure_active(host.refs[name]) == f"{name}@1"
    assert host.cache.loaded_names()[:2] == sorted(f"{n}@1" for n in kept)
    assert len(host.cache.loaded_names()) == 3
    # The status says which owned adapters are not kept hot.
    entries = tier_entries(routes=host.routes, loaded=host.cache.loaded_names(),
                           on_disk=set(), owned=placement.owned(),
                           over_capacity=placement.over_capacity())
    assert {e.adapter for e in entries if e.over_capacity} == set(OWNED) - kept
    assert not any(e.over_capacity for e in entries if e.adapter in kept | {"elsewhere"})


async def test_a_freed_slot_goes_to_an_adapter_over_capacity(tmp_path: Path) -> None:
    host = await settled(tmp_path)
    placement = host.reconciler.placement
    host.registry.replicas["own-0"] = None  # placement cleared: own-0 is owned no more
    host.reconciler.notify("own-0")  # as its placement_changed event does: read it again
    assert isinstance(await host.reconciler.reconcile("own-0"), Done)
    assert placement.kept() == {"own-1"}
    # The adapters waiting over capacity were queued; the first to run takes the slot.
    assert all(isinstance(o, Done) for o in await host.run_queue())
    assert placement.kept() == {"own-1", "own-2"}
    assert placement.over_capacity() == {"own-3", "own-4"}
    assert "own-2@1" in host.vllm.names
    assert host.cache.pinned() == {"own-1", "own-2"}
    assert (host.gauge("kept_hot"), host.gauge("over_capacity")) == (2, 2)


async def test_configured_pins_take_their_slots_first(tmp_path: Path) -> None:
    host = await settled(tmp_path, capacity=4, pins=("elsewhere",))
    # 4 - 1 for on-demand loads - 1 for --pin elsewhere.
    assert host.reconciler.placement.kept() == {"own-0", "own-1"}
    assert host.cache.pinned() == {"elsewhere", "own-0", "own-1"}


async def test_a_kept_adapter_whose_load_fails_for_now_is_retried(tmp_path: Path) -> None:
    cache = FakeCache()
    failing = _FailingLoads(cache)
    host = Host(tmp_path)
    reconciler = Reconciler(
        base_model=BASE, registry=host.registry, routes=host.routes,
        swapper=FakeSwapper(host.routes), cache=failing, queue=host.queue,
        metrics=host.metrics, max_attempts=3, agent_id="solo", max_loaded=3)
    host.publish("own-0", 1)
    outcome = await reconciler.reconcile("own-0")
    assert isinstance(outcome, Retry) and "vLLM is restarting" in outcome.reason
    assert cache.pinned == {"own-0"}
    failing.down = False
    assert isinstance(await reconciler.reconcile("own-0"), Done)
    assert cache.loaded == ["own-0@1"]


class _FailingLoads:
    """A FakeCache whose loads fail while ``down`` (vLLM restarting)."""

    def __init__(self, cache: FakeCache) -> None:
        self._cache = cache
        self.down = True

    def pin(self, adapter: str) -> None:
        self._cache.pin(adapter)

    def unpin(self, adapter: str) -> None:
        self._cache.unpin(adapter)

    def is_pinned(self, adapter: str) -> bool:
        return self._cache.is_pinned(adapter)

    def is_active(self, name: str) -> bool:
        return self._cache.is_active(name)

    async def ensure_active(self, target: VersionRef) -> str:
        if self.down:
            raise VllmUnavailable("vLLM is restarting")
        return await self._cache.ensure_active(target)

    async def resync(self) -> set[str]:
        return await self._cache.resync()


def test_without_a_limit_every_owned_adapter_is_kept() -> None:
    cache = FakeCache()
    placement = Placement("solo", cache)
    placement.set_fleet(["solo"])
    assert all(placement.place(name, 1) for name in OWNED)
    assert placement.over_capacity() == set()
