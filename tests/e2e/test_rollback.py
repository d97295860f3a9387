"""A rollback returns every agent of the fleet to the previous version."""

from __future__ import annotations

import pytest

from devharness.openai_client import RETRY_OVER_HTTP, OpenAIClient
from devharness.testbed import Testbed
from devharness.waiting import eventually
from loraplane.api import AliasRollout
from loraplane.client import AsyncRegistryClient
from tests.e2e.steps import direct, new_adapter, publish, served_by, vllm_models

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


async def converged_on(api: AsyncRegistryClient, name: str, version: int
                       ) -> AliasRollout | None:
    """The ``live`` rollout once every agent reports serving ``version``."""
    rollout = await api.rollout(name)
    live = next(a for a in rollout.aliases if a.alias == "live")
    serving = {e.agent_id for e in live.serving
               if e.version == version and e.state == "serving"}
    done = live.version == version and live.converged
    return live if done and {"agent-a", "agent-b"} <= serving else None


async def test_rollback_returns_both_agents_to_v1(
        testbed: Testbed, api: AsyncRegistryClient, agent_a: OpenAIClient, agent_b: OpenAIClient,
        vllm_a: OpenAIClient, unique: str) -> None:
    name = f"rollback-{unique}"
    v1, v2 = f"{name}@1", f"{name}@2"
    agents = {"a": agent_a, "b": agent_b}
    await new_adapter(api, name, testbed.adapter_dir("a1"))
    assert await publish(api, name, testbed.adapter_dir("a2")) == 2
    v1_text = (await direct(vllm_a, testbed.adapter_dir("a1"))).text
    v2_text = (await direct(vllm_a, testbed.adapter_dir("a2"))).text
    assert v1_text != v2_text
    for client in agents.values():
        assert (await served_by(client, name, v2)).text == v2_text
    await eventually(lambda: converged_on(api, name, 2), timeout_s=20, retrying=RETRY_OVER_HTTP,
                     what="both agents reporting v2")

    rolled = await api.rollback(name)
    assert (rolled.previous_version, rolled.version) == (2, 1)
    for client in agents.values():
        back = await served_by(client, name, v1, timeout_s=20, texts={v1: v1_text, v2: v2_text})
        assert back.model == v1
    await eventually(lambda: converged_on(api, name, 1), timeout_s=20, retrying=RETRY_OVER_HTTP,
                     what="both agents reporting v1")

    # v2 is drained and unloaded everywhere: nothing routes to it any more.
    for host, server in testbed.vllms.items():
        async def v2_gone(url: str = server.url) -> bool:
            names = await vllm_models(url)
            return v2 not in names and v1 in names

        await eventually(v2_gone, timeout_s=15, retrying=RETRY_OVER_HTTP,
                         what=f"only {v1} loaded on {host}")
