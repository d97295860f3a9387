"""Routing the way llm-d's endpoint picker does, against the testbed's two real vLLMs.

Each agent holds 3 versions (``--max-loaded 3``, vLLM ``--max-loras 3``); the test uses
5 adapters, more than one agent holds but fewer than the two hold together. A client
(devharness/llmd_picker.py) scrapes both agents' ``/metrics/model-server`` before every
request and picks an agent with llm-d's scorers and weights (deploy/kubernetes/epp.yaml),
or, for comparison in the same run, at random; requests go one at a time, uniformly over
the adapters, from the same seeded stream. Each policy has adapters of its own (same
files, other names), so neither inherits what the other loaded.

What is asserted holds whatever the machine's speed:

- the picker never sends a request to an agent without the adapter while the other one
  has it, so each adapter is loaded exactly once in the fleet: its misses are exactly
  the adapters it requested, and every later request is a hit;
- at random, a request finds its adapter only where that agent happens to hold it (at
  most 3 of the 5 adapters, so at most 60 % in expectation): the picker's hit rate is
  clearly above it;
- both ways, the hits the client predicted from the scrape (the agent it chose listed the
  adapter as running) are the hits the agents' caches counted: the page tells the truth.

This is also the short form of ``bench/routing_hit_rate.py``, which runs the same code.
"""

from __future__ import annotations

import pytest

from devharness.llmd_picker import Comparison, PolicyRun, Setup, compare
from devharness.testbed import E2E_TENANT, Testbed
from loraplane.client import AsyncRegistryClient

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

ADAPTERS = 5
REQUESTS = 60


def _check_consistent(run: PolicyRun) -> None:
    assert run.failed == 0, run.summary()
    assert run.agent_hits + run.agent_misses == run.requests, run.summary()
    assert run.agent_hits == run.hot_at_pick, (
        "the agents counted other hits than their pages promised", run.summary())


def report(result: Comparison) -> str:
    return (f"hit rate over {result.requests} requests to {result.adapters} adapters: "
            f"llm-d scorer {result.by_picker.hit_rate:.2f}, "
            f"random {result.at_random.hit_rate:.2f}\n"
            f"{result.by_picker.summary()}\n{result.at_random.summary()}")


async def test_an_llmd_picker_sends_most_requests_where_the_adapter_is_hot(
        testbed: Testbed, api: AsyncRegistryClient, unique: str) -> None:
    agents = {agent.agent_id: agent.url for agent in testbed.agents.values()}
    setup = Setup(api=api, agents=agents, inference_token=testbed.inference_token,
                  adapter_dir=testbed.adapter_dir("a1"), base_model=testbed.base_model,
                  tenant=E2E_TENANT, slots=3 * len(agents))
    result = await compare(setup, f"route-{unique}", adapters=ADAPTERS, requests=REQUESTS)
    print(report(result))  # shown with -s, and in the log of a failure
    picked, randomly = result.by_picker, result.at_random
    _check_consistent(randomly)
    _check_consistent(picked)
    assert picked.hot_elsewhere == 0, report(result)
    # Each adapter loaded once in the fleet; every later request a hit.
    assert picked.agent_misses == result.distinct, report(result)
    # At random 3 of the 5 adapters sit on the chosen agent: 0.6 once warm (this seeded
    # stream and seeded picks give 39 of 60 whatever the fleet held before: new
    # adapters, LRU), against the picker's (60 - 5) / 60.
    assert randomly.hit_rate < 0.75 < picked.hit_rate, report(result)
