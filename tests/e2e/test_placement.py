"""Placement with real vLLM: an adapter with ``replicas=1`` is kept hot on exactly its
owner (by rendezvous hashing over the two live agents) and left cold (not downloaded)
on the other until a request there loads it;
the fleet view shows where it is placed and where it is hot, and each agent's /metrics
counts the tier transitions.

agent-b learns of the adapter and of its placement from events only (it practically
never resyncs), so this also shows the placement travelling with the event stream.
Then agent-b leaves: agent-a owns every adapter, keeps hot what its slots allow (one of
them stays over capacity, shown in the fleet view) and loads nothing else; then agent-b
joins again and takes over exactly the adapters rendezvous hashing gives it, while
agent-a loads and unloads nothing (vLLM's own logs count the loads and unloads).
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
              and _tiers(rollout, owner) == {"hot"} and _tiers(rollout, other) == {"cold"})
        return rollout if ok else None

    rollout = await eventually(placed, timeout_s=120, retrying=RETRY_OVER_HTTP,
                               what=f"{name} hot on {owner} only, cold on {other}")
    assert all(t.owned == (t.agent_id == owner) for t in rollout.tiers), rollout.tiers
    owner_vllm = testbed.vllms[hosts[owner]].url
    other_vllm = testbed.vllms[hosts[other]].url
    assert served in await vllm_models(owner_vllm)
    assert served not in await vllm_models(other_vllm), "loaded only on demand there"

    # A request to the other agent downloads and loads it there, at once.
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
    """Adapter names that rendezvous hashing places one on agent-a and two on agent-b.

    Alone, agent-a owns all three but has slots for two (``--max-loaded 3``, one slot kept
    for on-demand loads): one of agent-b's is over capacity there."""
    on_a: list[str] = []
    on_b: list[str] = []
    for i in range(100):
        name = f"move-{unique}-{i}"
        owner = owners(["agent-a", "agent-b"], name, 1)[0]
        (on_a if owner == "agent-a" else on_b).append(name)
        if len(on_a) >= 1 and len(on_b) >= 2:
            return on_a[:1], on_b[:2]
    raise AssertionError("no such names in 100 tries")


class Fleet:
    """The rollouts of the test's adapters, as the registry's fleet view shows them."""

    def __init__(self, api: AsyncRegistryClient, names: list[str]) -> None:
        self.api = api
        self.names = names

    async def rollouts(self) -> dict[str, RolloutOut]:
        return {name: await self.api.rollout(name) for name in self.names}

    async def placed(self, expected: dict[str, str]) -> dict[str, RolloutOut] | None:
        """The rollouts once each adapter is placed on its expected owner, else None."""
        rollouts = await self.rollouts()
        ok = all(rollouts[n].placed == [owner] for n, owner in expected.items())
        return rollouts if ok else None


def _over_capacity(rollout: RolloutOut) -> set[str]:
    return {t.agent_id for t in rollout.tiers if t.over_capacity and not t.stale}


async def test_an_agent_leaving_and_joining_moves_only_the_adapters_whose_owners_change(
        testbed: Testbed, api: AsyncRegistryClient, unique: str,
        agent_b_variant: AgentVariant) -> None:
    on_a, on_b = _names(unique)
    fleet = Fleet(api, on_a + on_b)
    together = {**dict.fromkeys(on_a, "agent-a"), **dict.fromkeys(on_b, "agent-b")}
    try:
        for name in on_a + on_b:
            await api.create_adapter(name, testbed.base_model, tenant="e2e", replicas=1)
            await publish(api, name, testbed.adapter_dir("a1"))

        async def settled() -> bool:
            rollouts = await fleet.placed(together)
            return rollouts is not None and all(
                together[n] in r.hot for n, r in rollouts.items())

        await eventually(settled, timeout_s=120, retrying=RETRY_OVER_HTTP,
                         what="each adapter hot on its owner")
        await _leave(testbed, fleet, on_a, on_b)
        await _join(testbed, fleet, together, on_b)
    finally:
        for name in on_a + on_b:
            with contextlib.suppress(NotFound):  # a failure before it was made
                await api.delete_adapter(name)


async def _leave(testbed: Testbed, fleet: Fleet, on_a: list[str], on_b: list[str]) -> None:
    """agent-b leaves: agent-a owns all three, keeps one of agent-b's hot (its last free
    slot for owned adapters) and reports the other over capacity; it loads nothing else."""
    loads = testbed.vllms["a"].load_requests()
    testbed.agents["b"].stop()
    alone = dict.fromkeys(on_a + on_b, "agent-a")

    async def taken_over() -> dict[str, RolloutOut] | None:
        rollouts = await fleet.placed(alone)
        if rollouts is None:
            return None
        over = [n for n in on_b if "agent-a" in _over_capacity(rollouts[n])]
        hot = [n for n in on_a + on_b if "agent-a" in rollouts[n].hot]
        return rollouts if len(over) == 1 and len(hot) == 2 else None

    # agent-b stopped gracefully: its last report says it is leaving, so the registry
    # publishes the smaller fleet at once and agent-a re-places from that event.
    rollouts = await eventually(taken_over, timeout_s=240, retrying=RETRY_OVER_HTTP,
                                what="agent-a owning all three, one over capacity")
    kept = [n for n in on_b if "agent-a" in rollouts[n].hot]
    models = await vllm_models(testbed.vllms["a"].url)
    assert {f"{n}@1" for n in on_a + kept} <= models, models
    # One load on agent-a: the one of agent-b's adapters that it had a slot for.
    assert testbed.vllms["a"].load_requests() == loads + 1


async def _join(testbed: Testbed, fleet: Fleet, together: dict[str, str],
                on_b: list[str]) -> None:
    """agent-b joins again: it takes over exactly the adapters rendezvous hashing gives
    it (its own two), loading each once; agent-a loads nothing and lets them go."""
    loads_a, loads_b = (testbed.vllms[h].load_requests() for h in ("a", "b"))
    unloads_a = _unload_requests(testbed, "a")
    testbed.agents["b"].restart()

    async def rejoined() -> bool:
        rollouts = await fleet.placed(together)
        return rollouts is not None and all(
            together[n] in r.hot and not _over_capacity(r) for n, r in rollouts.items())

    await eventually(rejoined, timeout_s=120, retrying=RETRY_OVER_HTTP,
                     what="agent-b owning and loading its adapters again")
    assert {f"{n}@1" for n in on_b} <= await vllm_models(testbed.vllms["b"].url)
    assert testbed.vllms["b"].load_requests() == loads_b + len(on_b)
    # agent-a only unpins what moved: no load, no unload.
    assert testbed.vllms["a"].load_requests() == loads_a
    assert _unload_requests(testbed, "a") == unloads_a
