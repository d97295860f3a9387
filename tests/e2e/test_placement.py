"""Placement with real vLLM: an adapter with ``replicas=1`` is kept hot on exactly its
owner (by rendezvous hashing over the two live agents) and loaded on demand on the other;
the fleet view shows where it is placed and where it is hot, and each agent's /metrics
counts the tier transitions.

agent-b learns of the adapter and of its placement from events only (it practically
never resyncs), so this also shows the placement travelling with the event stream.
"""

from __future__ import annotations

import pytest

from devharness.openai_client import RETRY_OVER_HTTP, OpenAIClient
from devharness.testbed import Testbed, metric
from devharness.waiting import eventually
from loraplane.api import RolloutOut
from loraplane.client import AsyncRegistryClient
from loraplane.placement import owners
from tests.e2e.steps import publish, vllm_models

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]
TRANSITIONS = "loraplane_agent_tier_transitions_total"
TIER_SECONDS = "loraplane_agent_tier_transition_seconds_count"


def _tiers(rollout: RolloutOut, agent_id: str) -> set[str]:
    return {t.tier for t in rollout.tiers if t.agent_id == agent_id and t.version == 1}


async def test_replicas_one_is_hot_on_its_owner_and_on_demand_elsewhere(
        testbed: Testbed, api: AsyncRegistryClient, agent_a: OpenAIClient,
        agent_b: OpenAIClient, unique: str) -> None:
    name = f"placed-{unique}"
    hosts = {"agent-a": "a", "agent-b": "b"}
    owner = owners(hosts, name, 1)[0]
    other = "agent-b" if owner == "agent-a" else "agent-a"
    clients = {"agent-a": agent_a, "agent-b": agent_b}
    before = {h: metric(testbed.agents[h].metrics(), TRANSITIONS, **{"from": "warm",
                                                                     "to": "hot"})
              for h in ("a", "b")}
    made = await api.create_adapter(name, testbed.base_model, tenant="e2e", replicas=1)
    assert made.replicas == 1
    await publish(api, name, testbed.adapter_dir("a1"))
    served = f"{name}@1"

    async def placed() -> RolloutOut | None:
        rollout = await api.rollout(name)
        converged = all(a.converged for a in rollout.aliases)
        ok = (converged and rollout.placed == [owner] and rollout.hot == [owner]
              and _tiers(rollout, owner) == {"hot"} and _tiers(rollout, other) == {"warm"})
        return rollout if ok else None

    rollout = await eventually(placed, timeout_s=120, retrying=RETRY_OVER_HTTP,
                               what=f"{name} hot on {owner} only, warm on {other}")
    assert all(t.owned == (t.agent_id == owner) for t in rollout.tiers), rollout.tiers
    owner_vllm = testbed.vllms[hosts[owner]].url
    other_vllm = testbed.vllms[hosts[other]].url
    assert served in await vllm_models(owner_vllm)
    assert served not in await vllm_models(other_vllm), "loaded only on demand there"

    # A request to the other agent loads it there, at once.
    result = await clients[other].complete(name)
    assert result.adapter == served
    assert served in await vllm_models(other_vllm)

    async def hot_on_both() -> bool:
        return (await api.rollout(name)).hot == sorted(hosts)

    await eventually(hot_on_both, timeout_s=30, retrying=RETRY_OVER_HTTP,
                     what="the fleet view showing it hot on both agents")
    for agent_id, host in hosts.items():
        text = testbed.agents[host].metrics()
        moved = metric(text, TRANSITIONS, **{"from": "warm", "to": "hot"})
        assert moved >= before[host] + 1, (agent_id, moved, before[host])
        assert metric(text, TIER_SECONDS, **{"from": "warm", "to": "hot"}) >= 1
        assert metric(text, TRANSITIONS, **{"from": "cold", "to": "warm"}) >= 1

    # Deleted: the owner lets it go (unpinned, unloaded with its alias).
    await api.delete_adapter(name)

    async def gone() -> bool:
        return served not in await vllm_models(owner_vllm) | await vllm_models(other_vllm)

    await eventually(gone, timeout_s=60, retrying=RETRY_OVER_HTTP,
                     what=f"{served} unloaded everywhere after the delete")
