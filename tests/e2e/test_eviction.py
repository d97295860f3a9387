"""More adapters than capacity: the least recently used idle version is evicted, a version
with a request in flight never is."""

from __future__ import annotations

import pytest

from devharness.openai_client import RETRY_OVER_HTTP, OpenAIClient
from devharness.tcp_pause import PausableTcpProxy
from devharness.testbed import Testbed, metric
from devharness.waiting import eventually
from loraplane.client import AsyncRegistryClient
from tests.e2e.conftest import AgentVariant
from tests.e2e.steps import direct, held_stream, new_adapter, vllm_models

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]
EVICTIONS = "loraplane_agent_cache_evictions_total"
REQUESTS = "loraplane_agent_requests_total"


async def test_lru_idle_version_is_evicted_never_one_in_flight(
        testbed: Testbed, api: AsyncRegistryClient, agent_b: OpenAIClient, unique: str,
        tcp_proxy_b: PausableTcpProxy, agent_b_variant: AgentVariant) -> None:
    agent, vllm_url = testbed.agents["b"], testbed.vllms["b"].url
    names = {folder: f"evict-{folder}-{unique}" for folder in ("a1", "a2", "a3")}
    served = {folder: f"{name}@1" for folder, name in names.items()}
    texts: dict[str, str] = {}
    async with OpenAIClient(vllm_url) as vllm_b:
        for folder, name in names.items():
            await new_adapter(api, name, testbed.adapter_dir(folder))
            texts[folder] = (await direct(vllm_b, testbed.adapter_dir(folder))).text
    # One tenant's requests on both slots at once: its share of the slots is all of
    # them here (the default leaves one of two to other tenants: test_fairness.py).
    agent_b_variant.restart(agent.variant(
        max_loaded=2, vllm_url=tcp_proxy_b.url,
        settings={**agent.spec.settings, "tenant_slot_share": "1"}))

    async def known() -> bool:
        return set(names.values()) <= set(await agent_b.models())

    # Known everywhere, but nothing loaded yet: each loads at its first request.
    await eventually(known, timeout_s=20, retrying=RETRY_OVER_HTTP,
                     what="agent-b knowing the three adapters")
    assert not set(served.values()) & await vllm_models(vllm_url)
    evictions = metric(agent.metrics(), EVICTIONS)
    seen: list[set[str]] = []

    async def gone(name: str) -> bool:
        # An evicted version is unloaded in the background (AdapterCache._evict): the
        # load that took its slot does not wait for it.
        seen.append(await vllm_models(vllm_url))
        return name not in seen[-1]

    async with held_stream(agent_b, names["a1"], tcp_proxy_b) as held:
        await held.started()
        for folder in ("a2", "a3"):
            result = await agent_b.complete(names[folder])
            assert (result.adapter, result.text) == (served[folder], texts[folder])
        # Full at two: a2 (idle) made room for a3, not a1, older but streaming.
        assert metric(agent.metrics(), EVICTIONS) == evictions + 1
        await eventually(lambda: gone(served["a2"]), timeout_s=30,
                         what="vLLM unloading the evicted a2")
        # Still in flight: a request is counted once its lease is released.
        assert metric(agent.metrics(), REQUESTS, adapter=names["a1"]) == 0, \
            "the agent finished the stream although the TCP proxy held it"
        assert served["a1"] in seen[-1] and served["a3"] in seen[-1], seen[-1]
        finished = await held.release()
    assert finished.ok and finished.finish_reason == "length", finished
    assert (finished.adapter, finished.models_seen) == (served["a1"], {served["a1"]})

    async def recorded() -> bool:
        # Counted as the lease is released, a moment after the client has read the end.
        return metric(agent.metrics(), REQUESTS, adapter=names["a1"], status="200") == 1

    await eventually(recorded, timeout_s=15, retrying=RETRY_OVER_HTTP,
                     what="agent-b finishing the stream")
    # Now a1 is idle and the least recently used: a2 coming back evicts it.
    again = await agent_b.complete(names["a2"])
    assert (again.adapter, again.text) == (served["a2"], texts["a2"])
    assert metric(agent.metrics(), EVICTIONS) == evictions + 2
    await eventually(lambda: gone(served["a1"]), timeout_s=30,
                     what="vLLM unloading the evicted a1")
    assert {served["a2"], served["a3"]} <= seen[-1], seen[-1]
