"""An agent restart, a vLLM restart and a NATS outage during a push each end in the
desired state."""

from __future__ import annotations

import asyncio

import pytest

from devharness.openai_client import RETRY_OVER_HTTP, OpenAIClient
from devharness.testbed import Testbed, metric
from devharness.waiting import eventually
from loraplane.client import AsyncRegistryClient
from tests.e2e.conftest import AgentVariant
from tests.e2e.steps import direct, new_adapter, publish, served_by, vllm_models

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

EVENTS_PUBLISHED = "loraplane_registry_events_published_total"
EVENTS_RECEIVED = "loraplane_agent_event_delay_seconds_count"


async def test_agent_restart_picks_up_a_push_it_missed(
        testbed: Testbed, api: AsyncRegistryClient, agent_a: OpenAIClient, vllm_a: OpenAIClient,
        unique: str) -> None:
    name, vllm_url = f"restart-{unique}", testbed.vllms["a"].url
    await new_adapter(api, name, testbed.adapter_dir("a1"))
    await served_by(agent_a, name, f"{name}@1")
    v2_text = (await direct(vllm_a, testbed.adapter_dir("a2"))).text

    agent = testbed.agents["a"]
    assert agent.stop() == 0, agent.process.tail()
    assert await publish(api, name, testbed.adapter_dir("a2")) == 2
    assert f"{name}@1" in await vllm_models(vllm_url)  # the stopped agent's leftover
    agent.restart()

    served = await served_by(agent_a, name, f"{name}@2")
    assert served.text == v2_text
    # The new run unloads what the old one left behind and is not desired any more.
    names = await vllm_models(vllm_url)
    assert f"{name}@1" not in names and f"{name}@2" in names


async def test_vllm_restart_reloads_the_pinned_version_and_serves_again(
        testbed: Testbed, api: AsyncRegistryClient, agent_a: OpenAIClient, vllm_a: OpenAIClient,
        agent_a_variant: AgentVariant, unique: str) -> None:
    name, server = f"pinned-{unique}", testbed.vllms["a"]
    pinned = f"{name}@1"
    await new_adapter(api, name, testbed.adapter_dir("a3"))
    reference = (await direct(vllm_a, testbed.adapter_dir("a3"))).text
    agent_a_variant.restart(testbed.agents["a"].variant(pins=(name,)))
    assert pinned in await vllm_models(server.url)  # pinned: loaded before any request

    server.stop()
    down = await agent_a.complete(name)
    assert down.status == 503 and down.error is not None, down
    assert down.error["code"] == "vllm_unavailable"
    server.start()
    ready_s = await asyncio.to_thread(server.wait_ready, 300)
    print(f"\nvLLM restarted in {ready_s:.1f}s")

    async def reloaded() -> bool:
        return pinned in await vllm_models(server.url)

    # The periodic resync notices that vLLM lost it and loads it again, unasked.
    await eventually(reloaded, timeout_s=30, retrying=RETRY_OVER_HTTP,
                     what=f"{pinned} loaded again after the restart")
    served = await agent_a.complete(name)
    assert (served.adapter, served.text) == (pinned, reference)


async def test_nats_outage_during_a_push_is_caught_up(
        testbed: Testbed, api: AsyncRegistryClient, agent_a: OpenAIClient, agent_b: OpenAIClient,
        vllm_a: OpenAIClient, unique: str) -> None:
    """A push while NATS is down: the registry keeps the event in its outbox, every agent
    still converges, and once NATS is back the event goes out and reaches every agent.

    agent-b's timed resync is an hour away, so it converges during the outage through
    its follower: each broken session queues a full resync from the registry. Whether
    it has learnt the news before a given moment depends on when its fetches start to
    fail, so only the outcome is asserted, not the moment.
    """
    name = f"outage-{unique}"
    agents = {"a": agent_a, "b": agent_b}
    await new_adapter(api, name, testbed.adapter_dir("a4"))
    for client in agents.values():
        await served_by(client, name, f"{name}@1")
    v2_text = (await direct(vllm_a, testbed.adapter_dir("a5"))).text
    published = metric(testbed.registry.metrics(), EVENTS_PUBLISHED)
    received = {host: metric(testbed.agents[host].metrics(), EVENTS_RECEIVED)
                for host in agents}

    testbed.nats.stop()
    try:
        assert await publish(api, name, testbed.adapter_dir("a5")) == 2
        for host, client in agents.items():
            served = await served_by(client, name, f"{name}@2", timeout_s=90)
            assert served.text == v2_text, host
        assert metric(testbed.registry.metrics(), EVENTS_PUBLISHED) == published
    finally:
        testbed.nats.start()

    async def delivered() -> bool:
        if metric(testbed.registry.metrics(), EVENTS_PUBLISHED) <= published:
            return False
        return all(metric(testbed.agents[host].metrics(), EVENTS_RECEIVED) > received[host]
                   for host in agents)

    await eventually(delivered, timeout_s=90, retrying=RETRY_OVER_HTTP,
                     what="the outbox's events published and received by both agents")
    for host, client in agents.items():
        assert (await client.complete(name)).adapter == f"{name}@2", host
