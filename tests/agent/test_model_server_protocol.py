"""The agent speaks the model-server protocol on its ``/metrics``: a real vLLM, a registry
served over HTTP and a real NATS; vLLM reached through a TCP proxy that counts every
request the agent makes to it.

The page is read the way llm-d's endpoint picker reads it (devharness/llmd.py): every
loaded version under its client names, loaded and idle included, and vLLM's queue,
KV-cache and cache-config series, without a request to vLLM per scrape.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from devharness.llmd import LORA_INFO, families, lora_affinity_score, parse_endpoint
from devharness.services import NatsService
from devharness.tcp_pause import PausableTcpProxy
from devharness.vllm import VllmServer
from inference_agent.node.vllm_metrics import PASSED_FAMILIES
from inference_agent.service import Agent
from inference_agent.serving.model_server_metrics import MODEL_SERVER_METRICS_PATH
from inference_agent.settings import AgentSettings
from tests.agent.loop_support import running_agent, served_registry

BASE = "tiny-llama"
SCRAPES = 50


async def complete(client: httpx.AsyncClient, model: str) -> str | None:
    response = await client.post("/v1/completions", json={
        "model": model, "prompt": "hello", "max_tokens": 2, "temperature": 0})
    assert response.status_code == 200, response.text
    served: str | None = response.headers.get("x-loraplane-adapter")
    return served


@pytest.mark.vllm
async def test_the_agent_serves_the_protocol_from_memory(
        tmp_path: Path, nats: NatsService, tiny_model: Path, vllm_server: VllmServer,
        tcp_proxy: PausableTcpProxy) -> None:
    adapters = tiny_model / "adapters"
    async with served_registry(tmp_path, nats) as reg:
        for name in ("bot", "cold"):
            await reg.harness.create_adapter(name)
        await reg.publish("bot", adapters / "a1")
        await reg.publish("bot", adapters / "a2", aliases="canary")
        await reg.publish("cold", adapters / "a3")
        settings = AgentSettings(
            registry=reg.url, token=await reg.agent_token(), nats_url=nats.url,
            vllm_url=tcp_proxy.url, base_model=BASE, agent_id="gpu-p", port=0,
            base_model_config=tiny_model / "base" / "config.json",
            cache_dir=tmp_path / "cache", max_loaded=3,
            # No periodic call to vLLM in the background while the scrapes are counted:
            # vLLM's series are copied once, at start-up, and then on demand below.
            vllm_metrics_interval_s=60, resync_interval_s=3600, heartbeat_interval_s=2,
            shutdown_grace_s=15, retry_base_s=0.2, retry_max_s=1)
        _id, secret = await reg.inference_token("acme")
        async with running_agent(settings) as agent, httpx.AsyncClient(
                base_url=str(agent.url), timeout=60,
                headers={"Authorization": f"Bearer {secret}"}) as client:
            assert await complete(client, "bot") == "bot@1"
            assert await complete(client, "bot@canary") == "bot@2"
            await _scrapes_read_memory(client, tcp_proxy, vllm_server)
            await _the_copy_follows_vllm(agent, client, tcp_proxy)

async def _scrapes_read_memory(client: httpx.AsyncClient, tcp_proxy: PausableTcpProxy,
                               vllm_server: VllmServer) -> None:
    before = sum(tcp_proxy.requests.values())
    pages = [(await client.get(path)).text for _ in range(SCRAPES // 2)
             for path in ("/metrics", MODEL_SERVER_METRICS_PATH)]
    assert sum(tcp_proxy.requests.values()) == before, \
        f"{SCRAPES} scrapes of the agent made requests to vLLM: {tcp_proxy.requests}"
    page, lean = pages[-2:]
    # The lean path: the same protocol series, without the agent's own metrics.
    assert parse_endpoint(lean) == parse_endpoint(page)
    assert set(families(lean)) == {LORA_INFO} | (PASSED_FAMILIES & set(families(page)))
    seen = parse_endpoint(page)
    # Both versions, idle now, under every name a client may send; cold is not loaded.
    assert seen.active_models == {"bot", "bot@live", "bot@1", "bot@2", "bot@canary"}
    assert seen.waiting_models == set()
    # Five names and one of three slots free.
    assert seen.max_active_models == 6
    assert lora_affinity_score(seen, "bot@canary") == 1.0
    assert lora_affinity_score(seen, "cold") == 0.8
    # One lora series (the agent's, not vLLM's), and vLLM's others as vLLM has them.
    assert len(families(page)[LORA_INFO]) == 1
    async with httpx.AsyncClient(base_url=vllm_server.url, timeout=30) as vllm:
        direct = families((await vllm.get("/metrics")).text)
    ours = families(page)
    passed = PASSED_FAMILIES & set(direct)
    assert {"vllm:num_requests_waiting", "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc", "vllm:cache_config_info"} <= passed
    for name in passed:
        assert [s.labels for s in ours[name]] == [s.labels for s in direct[name]], name
    assert seen.waiting_queue == 0 and seen.running_requests == 0
    assert seen.cache_block_size and seen.cache_num_blocks


async def _the_copy_follows_vllm(agent: Agent, client: httpx.AsyncClient,
                                 tcp_proxy: PausableTcpProxy) -> None:
    """The background task's one call: vLLM's /metrics, once per refresh."""
    before = tcp_proxy.requests["GET /metrics"]
    scrapes = "loraplane_agent_vllm_metrics_scrapes_total"
    ok = agent.metrics.registry.get_sample_value(scrapes, {"outcome": "ok"})
    assert ok is not None and ok >= 1, "copied at start-up"
    assert await agent.vllm_series.refresh()
    assert tcp_proxy.requests["GET /metrics"] == before + 1
    page = (await client.get("/metrics")).text
    assert agent.metrics.registry.get_sample_value(scrapes, {"outcome": "ok"}) == ok + 1
    age = [s.value for s in families(page)["loraplane_agent_vllm_metrics_age_seconds"]]
    assert len(age) == 1 and 0 <= age[0] < 60
