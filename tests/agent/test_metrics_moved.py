"""Every agent metric moves when its action happens, as the agent's ``/metrics`` shows it:
a real vLLM, a registry served over HTTP and a real NATS.

``MOVED`` lists every metric family the agent declares; a metric added to
``AgentMetrics`` and not moved here fails ``test_every_agent_metric_is_tested``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devharness.registry import RegistryHarness
from devharness.services import NatsService
from devharness.vllm import VllmServer
from devharness.waiting import eventually
from inference_agent.metrics import AgentMetrics
from inference_agent.service import Agent
from inference_agent.settings import AgentSettings
from loraplane.events import STREAM_NAME, subject_for
from tests.agent.loop_support import served_registry

BASE = "tiny-llama"
# ServedRegistry.publish: a folder as a new version of an adapter.
Publish = Callable[[str, Path], Awaitable[int]]
PREFIX = "loraplane_agent_"
MOVED = {"requests", "request_errors", "request_seconds", "cache_hits", "cache_misses",
         "cache_evictions", "stage_seconds", "event_delay_seconds", "versions_loaded",
         "downloaded_bytes", "swaps", "failures", "process_resident_memory_bytes",
         "time_to_first_token_seconds", "tokens", "adapter_load_seconds",
         "loaded_adapter_bytes", "swap_seconds", "tier_transitions", "tier_transition_seconds",
         "owned_adapters", "file_fetches", "events_rejected"}
WARM_HOT = {"from": "warm", "to": "hot"}


def test_every_agent_metric_is_tested() -> None:
    declared = {family.name.removeprefix(PREFIX) for family in AgentMetrics().registry.collect()}
    assert declared == MOVED


class Scrape:
    """The agent's ``/metrics``, read over HTTP."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def __call__(self, sample: str, **labels: str) -> float:
        response = await self.client.get("/metrics")
        assert response.status_code == 200, response.text
        return sum(s.value for family in text_string_to_metric_families(response.text)
                   for s in family.samples
                   if s.name == PREFIX + sample and labels.items() <= s.labels.items())


async def complete(client: httpx.AsyncClient, model: str) -> int:
    response = await client.post("/v1/completions", json={
        "model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0})
    return response.status_code


async def stream(client: httpx.AsyncClient, model: str) -> int:
    """A streamed completion that asks vLLM for ``usage`` in its last event."""
    async with client.stream("POST", "/v1/completions", json={
            "model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}) as response:
        await response.aread()
        return response.status_code


@pytest.mark.vllm
async def test_every_agent_metric_moves(tmp_path: Path, nats: NatsService, tiny_model: Path,
                                        vllm_server: VllmServer) -> None:
    adapters = tiny_model / "adapters"
    async with served_registry(tmp_path, nats) as reg:
        for name, folder in (("bot", "a1"), ("cold", "a3"), ("third", "a4")):
            await reg.harness.create_adapter(name)
            await reg.publish(name, adapters / folder)
        settings = AgentSettings(
            registry=reg.url, token=await reg.agent_token(), nats_url=nats.url,
            vllm_url=vllm_server.url, base_model=BASE, agent_id="gpu-m", port=0,
            base_model_config=tiny_model / "base" / "config.json",
            cache_dir=tmp_path / "cache", max_loaded=2, resync_interval_s=60,
            heartbeat_interval_s=2, drain_timeout_s=5, shutdown_grace_s=15,
            retry_base_s=0.2, retry_max_s=1, max_attempts=2)
        _id, secret = await reg.inference_token("acme")
        agent = Agent(settings)
        run = asyncio.create_task(agent.run(install_signals=False))
        async with asyncio.timeout(120):
            await agent.ready.wait()
        assert agent.url is not None
        async with httpx.AsyncClient(base_url=agent.url, timeout=60, headers={
                "Authorization": f"Bearer {secret}"}) as client:
            await _moves(Scrape(client), client, reg.publish, adapters)
            await _placement(Scrape(client), reg.harness)
            await _refused(Scrape(client), nats.url)
        agent.stop()
        await asyncio.wait_for(run, 30)


async def _refused(read: Scrape, nats_url: str) -> None:
    """A message on the events subjects that the registry did not sign."""
    before = await read("events_rejected_total", reason="unsigned")
    client = await nats.connect(nats_url)
    try:
        await client.jetstream().publish(subject_for("acme", "bot"), b"{}",
                                         stream=STREAM_NAME)
    finally:
        await client.close()

    async def counted() -> bool:
        return await read("events_rejected_total", reason="unsigned") == before + 1

    await eventually(counted, timeout_s=30, what="the unsigned message refused")


async def _moves(read: Scrape, client: httpx.AsyncClient, publish: Publish,
                 adapters: Path) -> None:
    assert await read("process_resident_memory_bytes") > 0
    # First use of bot (fetched to disk at start-up, not loaded): a miss that loads it.
    before = {name: await read(name) for name in (
        "cache_misses_total", "cache_hits_total", "versions_loaded")}
    loads = await read("stage_seconds_count", stage="load")
    warm_hot = await read("tier_transitions_total", **WARM_HOT)
    timed = await read("tier_transition_seconds_count", **WARM_HOT)
    assert await complete(client, "bot") == 200
    assert await read("tier_transitions_total", **WARM_HOT) == warm_hot + 1
    assert await read("tier_transition_seconds_count", **WARM_HOT) == timed + 1
    assert await read("requests_total", adapter="bot", status="200") == 1
    assert await read("request_seconds_count", adapter="bot") == 1
    assert await read("cache_misses_total", adapter="bot") == before["cache_misses_total"] + 1
    assert await read("versions_loaded") == before["versions_loaded"] + 1
    assert await read("stage_seconds_count", stage="load") == loads + 1
    assert await read("adapter_load_seconds_count", adapter="bot") == 1
    # The files of bot's version: an adapter_config.json and weights, more than 1 KiB.
    assert await read("loaded_adapter_bytes", adapter="bot") > 1024
    # vLLM's usage: a prompt of a few tokens, up to four generated.
    generated = await read("tokens_total", adapter="bot", kind="completion")
    assert 1 <= generated <= 4
    assert await read("tokens_total", adapter="bot", kind="prompt") >= 1
    # Streamed, with usage in its last event; and now a hit.
    assert await stream(client, "bot") == 200
    assert await read("time_to_first_token_seconds_count", adapter="bot") == 1
    assert await read("tokens_total", adapter="bot", kind="completion") > generated
    assert await read("cache_hits_total", adapter="bot") >= before["cache_hits_total"] + 1
    # Two more adapters on two slots: the least recently used goes.
    evicted = await read("cache_evictions_total")
    hot_warm = await read("tier_transitions_total", **{"from": "hot", "to": "warm"})
    for model in ("cold", "third"):
        assert await complete(client, model) == 200
    assert await read("cache_evictions_total") > evicted
    # bot, the least recently used, went; its bytes went with it.
    assert await read("cache_evictions_total", adapter="bot") == 1
    assert await read("loaded_adapter_bytes", adapter="bot") == 0
    assert await read("tier_transitions_total", **{"from": "hot", "to": "warm"}) > hot_warm
    # An unknown model is refused and counted as an error of its reason.
    assert await complete(client, "nope") == 404
    assert await read("request_errors_total", reason="model_not_found") == 1
    await _swaps_and_failures(read, client, publish, adapters)


async def _swaps_and_failures(read: Scrape, client: httpx.AsyncClient, publish: Publish,
                              adapters: Path) -> None:
    moved = ("event_delay_seconds_count", "downloaded_bytes_total")
    before = {name: await read(name) for name in moved}
    applied = await read("swaps_total", adapter="third", outcome="applied")
    # The new version's download: blob store -> this agent's disk.
    cold_warm = {"from": "cold", "to": "warm"}
    before["tier_transitions_total"] = await read("tier_transitions_total", **cold_warm)
    stages = {s: await read("stage_seconds_count", stage=s) for s in ("fetch", "validate")}
    # The local blob store signs no URL: the files come through the registry.
    fetched = await read("file_fetches_total", source="registry", result="ok")
    # A new version of the loaded third: the event arrives, the version is downloaded and
    # checked, and the alias swaps.
    await publish("third", adapters / "a2")

    async def swapped() -> bool:
        return (all([await read(name, **(cold_warm if name.startswith("tier") else {}))
                     > count for name, count in before.items()])
                and all([await read("stage_seconds_count", stage=s) > count
                         for s, count in stages.items()])
                and await read("swaps_total", adapter="third", outcome="applied") > applied
                and await read("swap_seconds_count", adapter="third") >= 1
                and await read("file_fetches_total", source="registry", result="ok") > fetched)

    await eventually(swapped, timeout_s=60, what="the event, download, checks and swap")
    await publish("third", adapters / "bad-rank")

    async def failed() -> bool:
        return await read("failures_total", adapter="third", code="rank_too_large") >= 1

    await eventually(failed, timeout_s=60, what="the refused version counted")


async def _placement(read: Scrape, harness: RegistryHarness) -> None:
    """Two adapters placed on this agent alone: ``--max-loaded 2`` keeps one slot for
    on-demand loads, so one is kept hot and the other is over capacity."""
    for name in ("bot", "cold"):
        response = await harness.client.patch(f"/v1/adapters/{name}", json={"replicas": 1},
                                              headers=harness.admin_headers)
        assert response.status_code == 200, response.text

    async def placed() -> bool:
        return (await read("owned_adapters", state="kept_hot") == 1
                and await read("owned_adapters", state="over_capacity") == 1)

    await eventually(placed, timeout_s=60, what="one owned adapter kept hot, one over capacity")
