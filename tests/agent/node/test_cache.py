"""AdapterCache: LRU, pins, single-flight loads, eviction that respects leases, resync."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest

from devharness.waiting import eventually
from inference_agent.errors import CapacityExhausted, VllmRefused
from inference_agent.metrics import AgentMetrics
from inference_agent.node.cache import AdapterCache
from inference_agent.node.materialize import Materializer
from inference_agent.node.vllm_client import VllmClient
from loraplane.events import VersionRef
from tests.agent.adapter_refs import (
    FakeVllm,
    LocalFetch,
    WatchedLeases,
    adapter_ref,
)

MISSES = "loraplane_agent_cache_misses_total"


class World:
    def __init__(self, root: Path, capacity: int = 2, wait_s: float = 1.0) -> None:
        self.root = root
        self.vllm = FakeVllm()
        self.fetch = LocalFetch()
        self.leases = WatchedLeases()
        self.metrics = AgentMetrics()
        self.evicted: list[str] = []
        self.materializer = Materializer(root / "cache", max_bytes=10**9, fetch=self.fetch,
                                         base_shapes=None, max_rank=16, metrics=self.metrics)
        self.cache = AdapterCache(cast(VllmClient, self.vllm), self.materializer, self.leases,
                                  capacity=capacity, metrics=self.metrics,
                                  load_wait_timeout_s=wait_s, on_evict=self.evicted.append)
        self._refs: dict[tuple[str, int], VersionRef] = {}

    def ref(self, adapter: str, version: int = 1) -> VersionRef:
        key = (adapter, version)
        if key not in self._refs:
            self._refs[key] = adapter_ref(self.root, adapter, version)
        return self._refs[key]

    def value(self, metric: str) -> float:
        """Summed over the labels (``adapter``)."""
        return sum(s.value for family in self.metrics.registry.collect()
                   for s in family.samples if s.name == metric)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_loads_into_vllm_and_evicts_the_least_recently_used(world: World) -> None:
    a, b, c = world.ref("a"), world.ref("b"), world.ref("c")
    assert await world.cache.ensure_active(a) == "a@1"
    await world.cache.ensure_active(b)
    world.cache.touch("a@1")  # b is now the least recently used
    await world.cache.ensure_active(c)
    assert world.cache.loaded_names() == ["a@1", "c@1"]
    assert set(world.vllm.names) == {"a@1", "c@1"}
    assert world.vllm.unload_calls == ["b@1"] and world.evicted == ["b@1"]
    assert world.materializer.path_of(a) is not None, "validated on disk"
    assert world.value("loraplane_agent_cache_evictions_total") == 1
    assert world.value("loraplane_agent_versions_loaded") == 2


async def test_a_loaded_version_counts_the_bytes_of_its_files(world: World) -> None:
    a = world.ref("a")
    path = await world.materializer.materialize(a)
    on_disk = sum(f.stat().st_size for f in path.iterdir())
    assert on_disk == sum(f.size for f in a.files) > 0
    await world.cache.ensure_active(a)
    sample = world.metrics.registry.get_sample_value(
        "loraplane_agent_loaded_adapter_bytes", {"adapter": "a"})
    assert sample == on_disk


async def test_a_miss_does_not_wait_for_the_unload_of_the_version_it_evicts(
        world: World) -> None:
    await world.cache.ensure_active(world.ref("a"))
    await world.cache.ensure_active(world.ref("b"))
    world.vllm.unload_gate = asyncio.Event()
    # vLLM holds the unload of a@1: c@1 is loaded (and served) meanwhile.
    assert await world.cache.ensure_active(world.ref("c")) == "c@1"
    assert world.vllm.unload_calls == ["a@1"] and "a@1" in world.vllm.names
    assert world.cache.loaded_names() == ["b@1", "c@1"] and world.evicted == ["a@1"]
    # A request for a@1 now waits for that unload, then loads it again (evicting b@1).
    again = asyncio.create_task(world.cache.ensure_active(world.ref("a")))
    await eventually(lambda: world.cache.is_loading("a@1"), what="a@1 loading again")
    assert world.vllm.load_calls.count("a@1") == 1, "loaded again before its unload ended"
    world.vllm.unload_gate.set()
    assert await again == "a@1"
    assert world.vllm.load_calls.count("a@1") == 2 and "a@1" in world.vllm.names
    await eventually(lambda: "b@1" not in world.vllm.names, what="b@1 unloaded")
    assert world.cache.loaded_names() == ["c@1", "a@1"]


async def test_a_failed_unload_of_an_evicted_version_leaves_a_stray_for_resync(
        world: World) -> None:
    await world.cache.ensure_active(world.ref("a"))
    await world.cache.ensure_active(world.ref("b"))
    world.vllm.down = True
    world.vllm.unload_gate = asyncio.Event()
    load = asyncio.create_task(world.cache.ensure_active(world.ref("c")))
    await eventually(lambda: world.vllm.unload_calls == ["a@1"], what="a@1 being unloaded")
    world.vllm.unload_gate.set()
    with pytest.raises(Exception, match="down"):
        await load
    world.vllm.down = False
    await eventually(lambda: not world.cache.in_use_names() - {"b@1"},
                     what="the failed unload settled")
    assert "a@1" in world.vllm.names, "vLLM still lists it"
    assert await world.cache.resync() == set()
    assert set(world.vllm.names) == {"b@1"}


async def test_hits_do_not_reload_and_are_counted(world: World) -> None:
    a = world.ref("a")
    await world.cache.ensure_active(a)
    await world.cache.ensure_active(a)
    await world.cache.ensure_active(a, record=False)
    assert world.vllm.load_calls == ["a@1"]
    assert world.value(MISSES) == 1
    assert world.value("loraplane_agent_cache_hits_total") == 1


async def test_concurrent_requests_wait_on_one_load(world: World) -> None:
    a = world.ref("a")
    world.vllm.gate = asyncio.Event()
    waiters = [asyncio.create_task(world.cache.ensure_active(a)) for _ in range(5)]
    # Every caller has asked, and the one load is held in vLLM.
    await eventually(lambda: world.value(MISSES) == 5 and world.vllm.load_calls == ["a@1"],
                     what="five callers on one load")
    assert world.cache.is_loading("a@1") and not world.cache.is_active("a@1")
    waiters[0].cancel()  # one client going away must not abort the others' load
    world.vllm.gate.set()
    results = await asyncio.gather(*waiters[1:])
    assert results == ["a@1"] * 4
    assert world.vllm.load_calls == ["a@1"] and len(world.fetch.calls) == 2
    assert world.value(MISSES) == 5


async def test_eviction_skips_versions_with_leases(world: World) -> None:
    a, b, c = world.ref("a"), world.ref("b"), world.ref("c")
    await world.cache.ensure_active(a)
    await world.cache.ensure_active(b)
    lease = world.leases.acquire("a@1")  # a is the oldest but in flight
    await world.cache.ensure_active(c)
    assert world.cache.loaded_names() == ["a@1", "c@1"]
    lease.release()


async def test_full_of_busy_versions_waits_for_a_release(world: World) -> None:
    a, b, c = world.ref("a"), world.ref("b"), world.ref("c")
    await world.cache.ensure_active(a)
    await world.cache.ensure_active(b)
    leases = [world.leases.acquire("a@1"), world.leases.acquire("b@1")]
    loading = asyncio.create_task(world.cache.ensure_active(c))
    # The load found every slot busy and waits for a release.
    await eventually(lambda: world.leases.any_idle_waits == 1, what="load waiting")
    assert not loading.done()
    assert world.vllm.load_calls == ["a@1", "b@1"] and world.vllm.unload_calls == []
    leases[1].release()
    assert await asyncio.wait_for(loading, 1) == "c@1"
    assert world.cache.loaded_names() == ["a@1", "c@1"]
    leases[0].release()


async def test_capacity_exhausted_after_the_wait(tmp_path: Path) -> None:
    world = World(tmp_path, wait_s=0.1)
    a, b, c = world.ref("a"), world.ref("b"), world.ref("c")
    await world.cache.ensure_active(a)
    await world.cache.ensure_active(b)
    leases = [world.leases.acquire("a@1"), world.leases.acquire("b@1")]
    with pytest.raises(CapacityExhausted):
        await world.cache.ensure_active(c)
    assert world.vllm.load_calls == ["a@1", "b@1"]
    for lease in leases:
        lease.release()
    assert await world.cache.ensure_active(c) == "c@1"  # the slot reservation was freed


async def test_pinned_adapters_are_never_evicted(world: World) -> None:
    world.cache.pin("a")
    a, b, c = world.ref("a"), world.ref("b"), world.ref("c")
    await world.cache.ensure_active(a)
    await world.cache.ensure_active(b)
    await world.cache.ensure_active(c)
    assert world.cache.loaded_names() == ["a@1", "c@1"]
    world.cache.pin("c")
    with pytest.raises(CapacityExhausted, match="pinned"):  # nothing leased: no waiting
        await world.cache.ensure_active(b)
    # Nothing was evicted to make room: every slot holds a pinned version.
    assert world.cache.loaded_names() == ["a@1", "c@1"]
    assert world.vllm.unload_calls == ["b@1"]


async def test_an_unrouted_version_of_a_pinned_adapter_can_be_evicted(world: World) -> None:
    routed = {"a@2"}
    world.cache.is_routed = routed.__contains__
    world.cache.pin("a")
    await world.cache.ensure_active(world.ref("a", 1))
    await world.cache.ensure_active(world.ref("a", 2))
    await world.cache.ensure_active(world.ref("b"))
    assert world.cache.loaded_names() == ["a@2", "b@1"]


async def test_a_failed_load_reaches_every_waiter_and_can_be_retried(world: World) -> None:
    a = world.ref("a")
    world.vllm.refuse.add("a@1")
    world.vllm.gate = asyncio.Event()
    waiters = [asyncio.create_task(world.cache.ensure_active(a)) for _ in range(3)]
    await eventually(lambda: world.value(MISSES) == 3 and world.vllm.load_calls == ["a@1"],
                     what="three callers on one load")
    world.vllm.gate.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, VllmRefused) for r in results)
    assert not world.cache.is_active("a@1") and not world.cache.is_loading("a@1")
    assert world.metrics.registry.get_sample_value(
        "loraplane_agent_failures_total", {"adapter": "a", "code": "vllm_refused"}) == 1
    world.vllm.refuse.clear()
    assert await world.cache.ensure_active(a) == "a@1"


async def test_remove_unloads_and_a_request_loads_it_again(world: World) -> None:
    a = world.ref("a")
    await world.cache.ensure_active(a)
    await world.cache.remove("a@1")
    assert not world.cache.is_active("a@1") and "a@1" not in world.vllm.names
    await world.cache.remove("a@1")  # idempotent
    assert await world.cache.ensure_active(a) == "a@1"
    assert world.vllm.load_calls == ["a@1", "a@1"]
    assert world.value("loraplane_agent_cache_evictions_total") == 0


async def test_resync_drops_what_vllm_lost_and_unloads_our_strays(world: World) -> None:
    await world.cache.ensure_active(world.ref("a"))
    await world.cache.ensure_active(world.ref("b"))
    del world.vllm.names["a@1"]  # vLLM restarted or someone unloaded it by hand
    world.vllm.names["old@7"] = Path("/nowhere")  # a previous run's version
    world.vllm.names["hand-made"] = Path("/nowhere")  # not ours: left alone
    assert await world.cache.resync() == {"a@1"}
    assert world.cache.loaded_names() == ["b@1"]
    assert set(world.vllm.names) == {"b@1", "hand-made"}
    assert await world.cache.ensure_active(world.ref("a")) == "a@1"


async def test_resync_keeps_a_stray_that_a_reconcile_loaded_meanwhile(world: World) -> None:
    """A restarted agent: vLLM still has two versions of the run before, which the cache
    does not know yet. While resync unloads the first, a reconcile loads the second (vLLM
    answers a load of a name it has as done): resync must not unload it after all."""
    world.vllm.names["a@1"] = Path("/nowhere")
    world.vllm.names["b@1"] = Path("/nowhere")
    world.vllm.unload_gate = asyncio.Event()
    resync = asyncio.create_task(world.cache.resync())
    await eventually(lambda: world.vllm.unload_calls == ["a@1"], what="a@1 being unloaded")
    assert await world.cache.ensure_active(world.ref("b")) == "b@1"
    world.vllm.unload_gate.set()
    assert await resync == set()
    assert world.vllm.unload_calls == ["a@1"]
    assert set(world.vllm.names) == {"b@1"} and world.cache.loaded_names() == ["b@1"]
