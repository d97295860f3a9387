"""A canary on real vLLM: 25 % of the customers on the new version, each customer on one
version, every answer exactly its version's; the agents' reports feed the analysis,
which moves the canary to its next step (50 %) where no customer moves back; and the
abort puts everyone back."""

from __future__ import annotations

import asyncio
import math

import pytest

from devharness.openai_client import OpenAIClient
from devharness.testbed import Testbed
from devharness.waiting import eventually
from loraplane.api.canaries import Canary, CanaryAnalysis
from loraplane.canary_split import takes_canary
from loraplane.client import AsyncRegistryClient
from tests.e2e.steps import direct, make_canary_due, new_adapter, publish, served_by

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

CUSTOMERS = [f"customer-{i:03d}" for i in range(100)]


async def test_a_quarter_of_the_customers_get_the_canary_and_the_abort_returns_them(
        testbed: Testbed, api: AsyncRegistryClient, agent_a: OpenAIClient,
        agent_b: OpenAIClient, vllm_a: OpenAIClient, unique: str) -> None:
    name = f"canary-{unique}"
    v1, v2 = f"{name}@1", f"{name}@2"
    await new_adapter(api, name, testbed.adapter_dir("a1"))
    assert await publish(api, name, testbed.adapter_dir("a2"), aliases=()) == 2
    texts = {v1: (await direct(vllm_a, testbed.adapter_dir("a1"))).text,
             v2: (await direct(vllm_a, testbed.adapter_dir("a2"))).text}
    assert texts[v1] != texts[v2]
    # Real vLLM on a shared CPU is no latency benchmark: only requests and errors judge.
    lenient = CanaryAnalysis(min_requests=20, max_latency_p95_ratio=100,
                             max_ttft_p95_ratio=100)
    canary = await api.start_canary(name, 2, steps=[25, 50], step_seconds=3600,
                                    analysis=lenient)
    # Both agents split once one customer the split gives the canary gets it there.
    chosen = next(c for c in CUSTOMERS if takes_canary(c, canary.id, 25))
    for agent in (agent_a, agent_b):
        await served_by(agent, name, v2, timeout_s=60, texts=texts,
                        headers={"X-Customer-Id": chosen})

    answers = await _ask_everyone(agent_a, agent_b, name, texts)
    versions = {c: set(seen) for c, seen in answers.items()}
    assert all(len(seen) == 1 for seen in versions.values()), "a customer saw both"
    on_canary = sum(seen == {v2} for seen in versions.values())
    # Binomial(100, 0.25): mean 25, sd 4.33; 4.4 sd either side.
    assert abs(on_canary - 25) <= 4.4 * math.sqrt(100 * 0.25 * 0.75), on_canary
    assert {c for c, seen in versions.items() if seen == {v2}} == {
        c for c in CUSTOMERS if takes_canary(c, canary.id, 25)}, "every agent splits alike"

    # Once both agents have reported the 400 requests (and those that waited for the
    # canary to be served), the step is judged: it passes.
    await eventually(lambda: _reported(api, name, 400), what="400 requests reported")
    await make_canary_due(testbed, canary.id)
    stepped = await eventually(lambda: _at_step(api, name, 2), what="the next step")
    assert stepped.weight == 50 and stepped.checks[0].canary_requests >= on_canary * 4
    newcomer = next(c for c in CUSTOMERS if takes_canary(c, canary.id, 50)
                    and not takes_canary(c, canary.id, 25))
    for agent in (agent_a, agent_b):
        await served_by(agent, name, v2, timeout_s=60, texts=texts,
                        headers={"X-Customer-Id": newcomer})
    after = {c: set(seen) for c, seen in
             (await _ask_everyone(agent_a, agent_b, name, texts)).items()}
    assert all(len(seen) == 1 for seen in after.values()), "a customer saw both"
    assert all(after[c] == {v2} for c, seen in versions.items() if seen == {v2}), (
        "a customer moved back to stable")
    assert {c for c, seen in after.items() if seen == {v2}} == {
        c for c in CUSTOMERS if takes_canary(c, canary.id, 50)}

    aborted = await api.abort_canary(name, reason="test over")
    assert aborted.state == "aborted" and aborted.weight == 0
    for agent in (agent_a, agent_b):
        await served_by(agent, name, v1, timeout_s=60, texts=texts,
                        headers={"X-Customer-Id": chosen})
    assert (await api.get_adapter(name)).aliases[0].version == 1


async def _reported(api: AsyncRegistryClient, name: str, requests: int) -> bool:
    """Whether the canary's live window holds ``requests`` requests over both sides."""
    live = (await api.get_canary(name)).live_checks or []
    return any(c.metric == "requests" and c.stable_requests + c.canary_requests >= requests
               for c in live)


async def _at_step(api: AsyncRegistryClient, name: str, step: int) -> Canary | None:
    canary = await api.get_canary(name)
    return canary if canary.step == step else None


async def _ask_everyone(agent_a: OpenAIClient, agent_b: OpenAIClient, name: str,
                        texts: dict[str, str]) -> dict[str, list[str]]:
    """Four requests from each customer, two to each agent; 0 failures and every answer
    exactly its version's output."""
    answers: dict[str, list[str]] = {c: [] for c in CUSTOMERS}
    limit = asyncio.Semaphore(4)

    async def ask(agent: OpenAIClient, customer: str) -> None:
        async with limit:
            result = await agent.complete(name, headers={"X-Customer-Id": customer})
        assert result.ok and result.adapter in texts, result
        assert result.text == texts[result.adapter], result
        answers[customer].append(result.adapter)

    await asyncio.gather(*(ask(agent, c) for c in CUSTOMERS
                           for agent in (agent_a, agent_b, agent_a, agent_b)))
    assert sum(len(seen) for seen in answers.values()) == 400
    return answers
