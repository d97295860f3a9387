"""Swapper with a narrow fake vLLM: load-before-flip, drains held by leases, failures."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from devharness.adapters import make_adapter
from devharness.waiting import eventually
from inference_agent.control.contract import SwapResult
from inference_agent.control.swap import Swapper
from inference_agent.errors import AdapterRejected, VllmRefused
from inference_agent.metrics import AgentMetrics
from inference_agent.node.cache import AdapterCache
from inference_agent.node.materialize import Materializer
from inference_agent.node.vllm_client import VllmClient
from inference_agent.serving.routes import CUSTOMER_HEADER, RouteTable
from inference_agent.serving.traffic import TrafficTally
from loraplane.events import CanaryRoute, VersionRef
from tests.agent.adapter_refs import (
    FakeVllm,
    LocalFetch,
    WatchedLeases,
    adapter_ref,
    ref_from_dir,
)


class Rig:
    def __init__(self, root: Path, drain_timeout_s: float = 5.0) -> None:
        self.root = root
        self.vllm = FakeVllm()
        self.leases = WatchedLeases()
        self.metrics = AgentMetrics()
        self.routes = RouteTable("tiny-llama")
        self.routes.set_owner("bot", "acme")
        self.fetch = LocalFetch()
        self.materializer = Materializer(root / "cache", max_bytes=10**9, fetch=self.fetch,
                                         base_shapes=None, max_rank=16, metrics=self.metrics)
        self.cache = AdapterCache(cast(VllmClient, self.vllm), self.materializer, self.leases,
                                  capacity=4, metrics=self.metrics, load_wait_timeout_s=1,
                                  is_routed=self.routes.is_routed)
        self.changes = 0
        self.tally = TrafficTally()
        self.swapper = Swapper(self.routes, self.cache, self.leases, self.materializer,
                               drain_timeout_s=drain_timeout_s, metrics=self.metrics,
                               on_change=self._changed, tally=self.tally)

    def _changed(self) -> None:
        self.changes += 1

    def ref(self, version: int) -> VersionRef:
        return adapter_ref(self.root, "bot", version)

    def serving(self) -> str:
        return self.routes.resolve("bot", {}, "acme").model_name


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


async def test_warm_fetches_and_validates_before_the_flip_and_loads_nothing(
        rig: Rig) -> None:
    v1 = rig.ref(1)
    result = await rig.swapper.apply("bot", "live", 1, v1, "warm")
    assert result == SwapResult("bot", "live", None, 1, loaded=False, flipped=True)
    assert rig.serving() == "bot@1" and rig.vllm.load_calls == []
    assert rig.materializer.path_of(v1) is not None  # validated before the flip
    assert rig.changes == 1


async def test_hot_loads_before_the_flip(rig: Rig) -> None:
    result = await rig.swapper.apply("bot", "live", 1, rig.ref(1), "hot")
    assert result.loaded and rig.cache.is_active("bot@1")


async def test_cold_only_flips_and_its_first_request_fetches_it(rig: Rig) -> None:
    v1 = rig.ref(1)
    result = await rig.swapper.apply("bot", "live", 1, v1, "cold")
    assert result == SwapResult("bot", "live", None, 1, loaded=False, flipped=True)
    assert rig.serving() == "bot@1" and rig.fetch.calls == []
    assert rig.materializer.path_of(v1) is None
    assert await rig.cache.ensure_active(v1) == "bot@1"
    assert len(rig.fetch.calls) == len(v1.files) and rig.vllm.load_calls == ["bot@1"]


async def test_cold_still_refuses_what_needs_no_download(rig: Rig) -> None:
    too_big = rig.ref(1).model_copy(update={"rank": 32})
    with pytest.raises(AdapterRejected) as info:
        await rig.swapper.apply("bot", "live", 1, too_big, "cold")
    assert info.value.code == "rank_too_large" and rig.routes.adapters() == set()


async def test_hot_swap_loads_flips_and_unloads_the_old_after_its_lease(rig: Rig) -> None:
    await rig.swapper.apply("bot", "live", 1, rig.ref(1))
    await rig.cache.ensure_active(rig.ref(1))
    lease = rig.leases.acquire("bot@1")  # a stream still running on the old version
    result = await rig.swapper.apply("bot", "live", 2, rig.ref(2), "hot")
    assert result == SwapResult("bot", "live", 1, 2, loaded=True, flipped=True)
    assert rig.serving() == "bot@2" and rig.cache.is_active("bot@2")
    # The drain is parked on bot@1's lease, and only its release can end the wait.
    await eventually(lambda: rig.leases.waiting["bot@1"] == 1, what="drain on the lease")
    assert rig.leases.idle_waits == [("bot@1", 5.0)], "bounded by the drain timeout only"
    assert rig.swapper.draining() == {"bot@1"} and "bot@1" in rig.vllm.names
    assert rig.metrics.registry.get_sample_value(
        "loraplane_agent_stage_seconds_count", {"stage": "drain"}) is None
    lease.release()
    # The drain task leaves draining() a loop step after its unload: wait for both.
    await eventually(lambda: "bot@1" not in rig.vllm.names and not rig.swapper.draining(),
                     what="bot@1 drained and unloaded")
    assert rig.cache.loaded_names() == ["bot@2"]
    assert rig.metrics.registry.get_sample_value(
        "loraplane_agent_stage_seconds_count", {"stage": "drain"}) == 1


async def test_a_stale_revision_changes_nothing(rig: Rig) -> None:
    await rig.swapper.apply("bot", "live", 5, rig.ref(1))
    result = await rig.swapper.apply("bot", "live", 4, rig.ref(2))
    assert not result.flipped and rig.serving() == "bot@1"
    assert rig.materializer.path_of(rig.ref(2)) is None  # not even fetched


async def test_a_bad_version_fails_before_the_flip(rig: Rig) -> None:
    await rig.swapper.apply("bot", "live", 1, rig.ref(1))
    await rig.cache.ensure_active(rig.ref(1))
    bad = ref_from_dir("bot", 2, make_adapter(rig.root / "bad", rank=32), rank=32)
    with pytest.raises(AdapterRejected):
        await rig.swapper.apply("bot", "live", 2, bad, "hot")
    rig.vllm.refuse.add("bot@3")
    with pytest.raises(VllmRefused):
        await rig.swapper.apply("bot", "live", 3, rig.ref(3), "hot")
    assert rig.serving() == "bot@1" and rig.cache.loaded_names() == ["bot@1"]
    assert rig.routes.alias("bot", "live")[0] == 1  # the retry can still apply revision 3
    rig.vllm.refuse.clear()
    assert (await rig.swapper.apply("bot", "live", 3, rig.ref(3))).flipped
    assert rig.metrics.registry.get_sample_value(
        "loraplane_agent_swaps_total", {"adapter": "bot", "outcome": "failed"}) == 2


async def test_rollback_while_draining_keeps_the_version(rig: Rig) -> None:
    await rig.swapper.apply("bot", "live", 1, rig.ref(1))
    await rig.cache.ensure_active(rig.ref(1))
    lease = rig.leases.acquire("bot@1")
    await rig.swapper.apply("bot", "live", 2, rig.ref(2), "hot")
    await rig.swapper.apply("bot", "live", 3, rig.ref(1), "hot")  # rolled back before the drain
    assert rig.serving() == "bot@1"
    lease.release()
    # Both drains (bot@1's, then bot@2's) have decided and ended.
    await eventually(lambda: "bot@2" not in rig.vllm.names and not rig.swapper.draining(),
                     what="bot@2 unloaded, drains over")
    assert rig.metrics.registry.get_sample_value(
        "loraplane_agent_stage_seconds_count", {"stage": "drain"}) == 2
    assert rig.cache.loaded_names() == ["bot@1"] and "bot@1" in rig.vllm.names


async def test_the_drain_timeout_bounds_a_stuck_lease(tmp_path: Path) -> None:
    rig = Rig(tmp_path, drain_timeout_s=0.1)
    await rig.swapper.apply("bot", "live", 1, rig.ref(1))
    await rig.cache.ensure_active(rig.ref(1))
    lease = rig.leases.acquire("bot@1")
    await rig.swapper.apply("bot", "live", 2, rig.ref(2), "hot")
    # The lease is never released first: only the drain timeout can end this wait.
    await eventually(lambda: "bot@1" not in rig.vllm.names, timeout_s=10,
                     what="timeout unload")
    lease.release()


async def test_removing_the_alias_drains_and_unloads(rig: Rig) -> None:
    await rig.swapper.apply("bot", "live", 1, rig.ref(1))
    await rig.cache.ensure_active(rig.ref(1))
    result = await rig.swapper.apply("bot", "live", 2, None)
    assert result.flipped and result.new is None
    await eventually(lambda: not rig.cache.loaded_names(), what="unloaded")
    assert rig.routes.adapters() == set()


async def test_drain_all_cancels_what_does_not_finish(rig: Rig) -> None:
    await rig.swapper.apply("bot", "live", 1, rig.ref(1))
    await rig.cache.ensure_active(rig.ref(1))
    lease = rig.leases.acquire("bot@1")
    await rig.swapper.apply("bot", "live", 2, rig.ref(2), "hot")
    await rig.swapper.drain_all(0.05)
    assert rig.swapper.draining() == set() and "bot@1" in rig.vllm.names
    lease.release()


async def test_disk_cache_keeps_routed_and_loaded_versions(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.materializer.max_bytes = 1  # every unneeded folder goes
    await rig.swapper.apply("bot", "live", 1, rig.ref(1))
    await rig.cache.ensure_active(rig.ref(1))
    await rig.swapper.apply("bot", "live", 2, rig.ref(2))
    # The folder goes in a worker thread.
    await eventually(lambda: rig.materializer.path_of(rig.ref(1)) is None, what="disk evict")
    assert rig.materializer.path_of(rig.ref(2)) is not None


async def test_a_drain_that_keeps_its_version_still_tells_of_its_end(rig: Rig) -> None:
    # A status report held until the drains end waits for this notice, not a timer.
    await rig.swapper.apply("bot", "live", 1, rig.ref(1))
    await rig.cache.ensure_active(rig.ref(1))
    lease = rig.leases.acquire("bot@1")
    await rig.swapper.apply("bot", "live", 2, rig.ref(2), "hot")  # bot@1 drains on its lease
    await rig.swapper.apply("bot", "live", 3, rig.ref(1), "hot")  # back to bot@1
    await eventually(lambda: rig.swapper.draining() == {"bot@1"}, what="bot@2's drain over")
    changes = rig.changes
    lease.release()  # bot@1's drain ends, keeping bot@1: it is routed again
    await eventually(lambda: not rig.swapper.draining(), what="bot@1's drain over")
    assert rig.changes == changes + 1
    assert "bot@1" in rig.vllm.names


def _canary(rig: Rig, version: int, weight: int) -> CanaryRoute:
    return CanaryRoute(id=11, weight=weight, target=rig.ref(version))


def _split(rig: Rig) -> set[str]:
    return {rig.routes.resolve("bot", {CUSTOMER_HEADER: f"c{i}"}, "acme").model_name
            for i in range(200)}


async def test_a_canary_is_loaded_beside_stable_and_drained_when_it_ends(rig: Rig) -> None:
    await rig.swapper.apply("bot", "live", 1, rig.ref(1), "hot")
    result = await rig.swapper.apply("bot", "live", 2, rig.ref(1), "hot", _canary(rig, 2, 50))
    assert result.flipped and not rig.swapper.canary_load_failures
    assert rig.tally.snapshot({11}) == []  # no load failure to tell
    assert rig.cache.is_active("bot@1") and rig.cache.is_active("bot@2")  # both hot
    assert _split(rig) == {"bot@1", "bot@2"}
    # The weight moves: the same versions, nothing loaded again.
    loads = len(rig.vllm.load_calls)
    await rig.swapper.apply("bot", "live", 3, rig.ref(1), "hot", _canary(rig, 2, 90))
    canary = rig.routes.canary("bot", "live")
    assert len(rig.vllm.load_calls) == loads and canary is not None and canary.weight == 90
    # Aborted: its share back on stable at once, its version drained and unloaded.
    await rig.swapper.apply("bot", "live", 4, rig.ref(1), "hot", None)
    assert _split(rig) == {"bot@1"}
    await eventually(lambda: "bot@2" not in rig.vllm.names and not rig.swapper.draining(),
                     what="the canary's version unloaded")
    assert rig.cache.loaded_names() == ["bot@1"]


async def test_a_canary_that_fails_to_load_is_never_served(rig: Rig) -> None:
    await rig.swapper.apply("bot", "live", 1, rig.ref(1), "hot")
    rig.vllm.refuse.add("bot@2")
    result = await rig.swapper.apply("bot", "live", 2, rig.ref(1), "hot", _canary(rig, 2, 90))
    assert result.flipped and rig.routes.alias("bot", "live")[0] == 2
    assert rig.swapper.canary_load_failures == {"bot@2": 1}
    assert _split(rig) == {"bot@1"}  # its share on stable, no request refused
    # The canary's traffic report says so, though no request went to it.
    assert rig.routes.canary_ids() == {11}
    (side,) = rig.tally.snapshot(rig.routes.canary_ids())
    assert (side.canary_id, side.track, side.load_failures, side.requests) == (
        11, "canary", 1, 0)
    rig.vllm.refuse.clear()
    await rig.swapper.apply("bot", "live", 3, rig.ref(1), "hot", _canary(rig, 2, 90))
    assert "bot@2" in _split(rig)


async def test_promotion_moves_the_alias_onto_the_loaded_canary(rig: Rig) -> None:
    await rig.swapper.apply("bot", "live", 1, rig.ref(1), "hot")
    await rig.swapper.apply("bot", "live", 2, rig.ref(1), "hot", _canary(rig, 2, 50))
    loads = len(rig.vllm.load_calls)
    result = await rig.swapper.apply("bot", "live", 3, rig.ref(2), "hot", None)
    assert result.flipped and len(rig.vllm.load_calls) == loads  # already loaded
    assert _split(rig) == {"bot@2"}
    await eventually(lambda: "bot@1" not in rig.vllm.names and not rig.swapper.draining(),
                     what="the old stable version unloaded")
    assert rig.cache.loaded_names() == ["bot@2"]
