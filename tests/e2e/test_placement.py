"""Placement with real vLLM: an adapter with ``replicas=1`` is kept hot on exactly its
owner (by rendezvous hashing over the two live agents) and loaded on demand on the other;
the fleet view shows where it is placed and where it is hot, and each agent's /metrics
counts the tier transitions.

agent-b learns of the adapter and of its placement from events only (it practically
never resyncs), so this also shows the placement travelling with the event stream.
Then agent-b leaves: agent-a takes over exactly agent-b's adapters, and loads nothing
else (vLLM's own log counts the loads and unloads).
"""

from __future__ import annotations

import contextlib

import pytest

from devharness.openai_client import RETRY_OVER_HTTP, OpenAIClient
from devharness.testbed import Testbed, metric
from devharness.waiting import eventually
from loraplane.api import RolloutOut
from loraplane.client import AsyncRegistryClient, NotFound
from loraplane.placement import owners
from tests.e2e.conftest import AgentVariant
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


def _unload_requests(testbed: Testbed, host: str) -> int:
    log = testbed.vllms[host].log_path.read_text(errors="replace")
    return log.count('"POST /v1/unload_lora_adapter HTTP/1.1"')


def _names(unique: str) -> tuple[list[str], list[str]]:
    """Adapter names that rendezvous hashing places one on agent-a and two on agent-b
    (three fit agent-a's three slots once agent-b is gone)."""
    on_a: list[str] = []
    on_b: list[str] = []
    for i in range(100):
        name = f"leave-{unique}-{i}"
        owner = owners(["agent-a", "agent-b"], name, 1)[0]
        (on_a if owner == "agent-a" else on_b).append(name)
        if len(on_a) >= 1 and len(on_b) >= 2:
            return on_a[:1], on_b[:2]
    raise AssertionError("no such names in 100 tries")


async def test_an_agent_leaving_moves_only_the_adapters_it_owned(
        testbed: Testbed, api: AsyncRegistryClient, unique: str,
        agent_b_variant: AgentVariant) -> None:
    on_a, on_b = _names(unique)
    try:
        for name in on_a + on_b:
            await api.create_adapter(name, testbed.base_model, tenant="e2e", replicas=1)
            await publish(api, name, testbed.adapter_dir("a1"))

        async def placed_on(names: list[str], agent_id: str) -> bool:
            rollouts = [await api.rollout(name) for name in names]
            return all(r.placed == [agent_id] and agent_id in r.hot for r in rollouts)

        async def settled() -> bool:
            return (await placed_on(on_a, "agent-a")) and await placed_on(on_b, "agent-b")

        await eventually(settled, timeout_s=120, retrying=RETRY_OVER_HTTP,
                         what="each adapter hot on its owner")
        loads, unloads = testbed.vllms["a"].load_requests(), _unload_requests(testbed, "a")
        testbed.agents["b"].stop()

        async def taken_over() -> bool:
            return await placed_on(on_a + on_b, "agent-a")

        # agent-b goes stale after the registry's 90 s; agent-a resyncs every 3 s.
        await eventually(taken_over, timeout_s=240, retrying=RETRY_OVER_HTTP,
                         what="agent-a owning and loading agent-b's adapters")
        models = await vllm_models(testbed.vllms["a"].url)
        assert {f"{n}@1" for n in on_a + on_b} <= models
        # Exactly agent-b's adapters loaded on agent-a; what agent-a owned stayed put.
        assert testbed.vllms["a"].load_requests() == loads + len(on_b)
        assert _unload_requests(testbed, "a") == unloads
    finally:
        for name in on_a + on_b:
            with contextlib.suppress(NotFound):  # a failure before it was made
                await api.delete_adapter(name)
