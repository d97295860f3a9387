"""VllmClient and one hot swap against a real vLLM server (CPU build, tiny model).

Requests are sent one at a time (the CPU engine's base/adapter batching bug, see
docs/vllm.md), and only adapter outputs are compared.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devharness.vllm import VllmServer
from devharness.waiting import eventually
from inference_agent.control.swap import Swapper
from inference_agent.errors import AdapterRejected, VllmRefused, VllmUnavailable
from inference_agent.metrics import AgentMetrics
from inference_agent.node.cache import AdapterCache
from inference_agent.node.materialize import Materializer
from inference_agent.node.vllm_client import VllmClient
from inference_agent.serving.routes import RouteTable
from loraplane.events import VersionRef
from loraplane.lora import BaseModelShapes
from loraplane.netutil import free_port
from tests.agent.adapter_refs import LocalFetch, WatchedLeases, ref_from_dir

pytestmark = pytest.mark.vllm
BASE = "tiny-llama"


@pytest.fixture(scope="module")
def server(vllm_server: VllmServer) -> VllmServer:
    return vllm_server


@pytest.fixture
async def vllm(server: VllmServer) -> AsyncIterator[VllmClient]:
    client = VllmClient(server.url, timeout_s=60)
    try:
        yield client
    finally:
        for name in await client.loaded():  # every test starts from no adapters
            await client.unload(name)
        await client.aclose()


async def complete(server: VllmServer, model: str) -> list[int]:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        response = await http.post("/v1/completions", json={
            "model": model, "prompt": "The quick brown fox", "max_tokens": 12,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    token_ids: list[int] = body["choices"][0]["token_ids"]
    return token_ids


def tiny_ref(tiny_model: Path, folder: str, adapter: str, version: int,
             rank: int = 8) -> VersionRef:
    return ref_from_dir(adapter, version, tiny_model / "adapters" / folder, rank=rank)


async def test_client_load_unload_are_idempotent(vllm: VllmClient, tiny_model: Path) -> None:
    await vllm.wait_ready(5)
    assert await vllm.loaded() == set()
    path = tiny_model / "adapters" / "a1"
    await vllm.load("a1@1", path)
    await vllm.load("a1@1", path)  # 400 "already loaded" is success
    assert await vllm.loaded() == {"a1@1"}
    await vllm.unload("a1@1")
    await vllm.unload("a1@1")  # 404 unknown is success
    assert await vllm.loaded() == set()


async def test_client_maps_refusals_and_outages(vllm: VllmClient, tiny_model: Path) -> None:
    with pytest.raises(VllmRefused, match="max_lora_rank"):
        await vllm.load("bad@1", tiny_model / "adapters" / "bad-rank")
    with pytest.raises(VllmRefused) as info:
        await vllm.load("gone@1", tiny_model / "adapters" / "does-not-exist")
    assert info.value.detail["status"] == 404
    assert await vllm.loaded() == set()
    dead = VllmClient(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    try:
        with pytest.raises(VllmUnavailable):
            await dead.load("a1@1", tiny_model / "adapters" / "a1")
        started = time.monotonic()
        with pytest.raises(VllmUnavailable, match="not ready"):
            await dead.wait_ready(0.5)
        assert time.monotonic() - started < 3
    finally:
        await dead.aclose()


class Agent:
    """The swap's parts, wired as service.py wires them, minus the registry."""

    def __init__(self, vllm: VllmClient, tiny_model: Path, cache_dir: Path) -> None:
        self.metrics = AgentMetrics()
        self.leases = WatchedLeases()
        self.routes = RouteTable(BASE)
        self.routes.set_owner("a1", "acme")
        shapes = BaseModelShapes.from_hf_config(tiny_model / "base")
        self.materializer = Materializer(cache_dir, max_bytes=10**9, fetch=LocalFetch(),
                                         base_shapes=shapes, max_rank=16,
                                         metrics=self.metrics)
        self.cache = AdapterCache(vllm, self.materializer, self.leases, capacity=4,
                                  metrics=self.metrics, load_wait_timeout_s=10,
                                  is_routed=self.routes.is_routed)
        self.swapper = Swapper(self.routes, self.cache, self.leases, self.materializer,
                               drain_timeout_s=60, metrics=self.metrics)


async def test_hot_swap_drains_the_old_version_before_unloading_it(
        vllm: VllmClient, server: VllmServer, tiny_model: Path, tmp_path: Path) -> None:
    agent = Agent(vllm, tiny_model, tmp_path / "cache")
    v1, v2 = tiny_ref(tiny_model, "a1", "a1", 1), tiny_ref(tiny_model, "a2", "a1", 2)
    await agent.swapper.apply("a1", "live", 1, v1)
    first = agent.routes.resolve("a1", {}, "acme")
    assert first.model_name == "a1@1"
    lease = agent.leases.acquire(first.model_name)  # a request in flight on a1@1
    assert await agent.cache.ensure_active(v1) == "a1@1"  # loaded at first request
    out1 = await complete(server, "a1@1")

    # a1 is hot here (a1@1 loaded): the reconciler has the swap load a1@2 first.
    result = await agent.swapper.apply("a1", "live", 2, v2, "hot")
    assert result.loaded and result.flipped and (result.old, result.new) == (1, 2)
    assert agent.routes.resolve("a1", {}, "acme").model_name == "a1@2"
    assert await vllm.loaded() == {"a1@1", "a1@2"}
    out2 = await complete(server, "a1@2")
    assert out2 != out1
    assert await complete(server, "a1@1") == out1  # the old request's weights stay intact
    # The drain is parked on a1@1's lease; only its release (or 60 s) ends that wait.
    await eventually(lambda: agent.leases.waiting["a1@1"] == 1, what="drain on the lease")
    assert agent.leases.idle_waits == [("a1@1", 60)]
    assert agent.swapper.draining() == {"a1@1"}
    assert await vllm.loaded() == {"a1@1", "a1@2"}, "unloaded while a lease was held"

    lease.release()
    await eventually(lambda: not agent.swapper.draining(), timeout_s=10, what="drain done")
    assert await vllm.loaded() == {"a1@2"}
    assert agent.cache.loaded_names() == ["a1@2"]
    # a1@2 carries a2's weights: same output as a2 loaded under another name.
    await vllm.load("check-a2", tiny_model / "adapters" / "a2")
    assert await complete(server, "check-a2") == out2


async def test_validation_refuses_what_vllm_would_accept(
        vllm: VllmClient, server: VllmServer, tiny_model: Path, tmp_path: Path) -> None:
    agent = Agent(vllm, tiny_model, tmp_path / "cache")
    await agent.swapper.apply("a1", "live", 1, tiny_ref(tiny_model, "a1", "a1", 1))
    await agent.cache.ensure_active(tiny_ref(tiny_model, "a1", "a1", 1))
    # vLLM loads other-base silently and serves nonsense (docs/vllm.md); we refuse it.
    with pytest.raises(AdapterRejected) as info:
        await agent.swapper.apply("a1", "live", 2, tiny_ref(tiny_model, "other-base", "a1", 2))
    assert info.value.code == "shape_mismatch"
    with pytest.raises(AdapterRejected) as info:
        await agent.swapper.apply("a1", "live", 3,
                                  tiny_ref(tiny_model, "bad-rank", "a1", 3, rank=32))
    assert info.value.code == "rank_too_large"
    assert agent.routes.resolve("a1", {}, "acme").model_name == "a1@1"
    assert await vllm.loaded() == {"a1@1"}


async def test_resync_finds_a_version_unloaded_by_hand(
        vllm: VllmClient, tiny_model: Path, tmp_path: Path) -> None:
    agent = Agent(vllm, tiny_model, tmp_path / "cache")
    v1 = tiny_ref(tiny_model, "a1", "a1", 1)
    await agent.cache.ensure_active(v1)
    await vllm.unload("a1@1")
    await vllm.load("a3@9", tiny_model / "adapters" / "a3")  # a stray of a previous run
    assert await agent.cache.resync() == {"a1@1"}
    assert await vllm.loaded() == set()
    await agent.cache.ensure_active(v1)
    assert await vllm.loaded() == {"a1@1"}
