"""A new version is swapped in under a running stream without disturbing it.

agent-a talks to vLLM through a TCP proxy that holds the stream's answer after its first
text until the swap is done (devharness/tcp_pause.py): the stream is surely in flight
across the swap, on a machine of any speed. Then it runs to its natural end and is
compared whole with an undisturbed run.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from devharness.openai_client import RETRY_OVER_HTTP, OpenAIClient
from devharness.tcp_pause import HELD_PROMPT, PausableTcpProxy
from devharness.testbed import Testbed
from devharness.waiting import eventually
from loraplane.client import AsyncRegistryClient
from tests.e2e.conftest import AgentVariant
from tests.e2e.steps import (
    LONG_TOKENS,
    agent_report,
    direct,
    held_stream,
    new_adapter,
    publish,
    served_by,
    vllm_models,
)

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

# vLLM may unload v1 right after the agent sent the stream's last bytes, a moment before
# the client has read them: samples answered that close to the end are not judged.
END_MARGIN_S = 0.2


async def watch_models(vllm_url: str, stop: asyncio.Event) -> list[tuple[float, set[str]]]:
    """vLLM's model list until ``stop`` is set, each with the time its answer came."""
    samples: list[tuple[float, set[str]]] = []
    async with httpx.AsyncClient(timeout=60) as http:
        while not stop.is_set():
            try:
                names = await vllm_models(vllm_url, http)
            except httpx.TransportError:
                # vLLM's server closed a kept-alive connection as this poll reused it
                # (seen once in CI). A lost sample judges nothing; the next one does.
                pass
            else:
                samples.append((time.monotonic(), names))
            await asyncio.sleep(0.05)
    return samples


async def reports_draining(api: AsyncRegistryClient, agent_id: str, name: str) -> bool:
    """The agent's last status report, in the registry's fleet view, shows ``name``
    draining: an old version whose drain has begun and waits for its requests."""
    agent = await agent_report(api, agent_id)
    served = agent.status.served if agent is not None else []
    adapter, _, version = name.rpartition("@")
    return any((e.adapter, e.version, e.state) == (adapter, int(version), "draining")
               for e in served)


async def test_push_during_a_stream_flips_new_requests_and_drains_the_stream(
        testbed: Testbed, api: AsyncRegistryClient, agent_a: OpenAIClient, vllm_a: OpenAIClient,
        unique: str, tcp_proxy_a: PausableTcpProxy, agent_a_variant: AgentVariant) -> None:
    name, vllm_url = f"swap-{unique}", testbed.vllms["a"].url
    v1, v2 = f"{name}@1", f"{name}@2"
    agent_a_variant.restart(testbed.agents["a"].variant(vllm_url=tcp_proxy_a.url))
    await new_adapter(api, name, testbed.adapter_dir("a1"))
    await served_by(agent_a, name, v1)
    v1_reference = await direct(vllm_a, testbed.adapter_dir("a1"))
    v2_reference = await direct(vllm_a, testbed.adapter_dir("a2"))
    texts = {v1: v1_reference.text, v2: v2_reference.text}
    undisturbed = await direct(vllm_a, testbed.adapter_dir("a1"), stream=True,
                               prompt=HELD_PROMPT, max_tokens=LONG_TOKENS)

    stop_watching = asyncio.Event()
    watcher = asyncio.create_task(watch_models(vllm_url, stop_watching))
    try:
        async with held_stream(agent_a, name, tcp_proxy_a) as held:
            await held.started()
            pushing_at = time.monotonic()
            assert await publish(api, name, testbed.adapter_dir("a2")) == 2
            pushed_at = time.monotonic()
            # Every answer on the way is v1's or v2's exact output, none fails.
            flipped = await served_by(agent_a, name, v2, timeout_s=60, texts=texts)
            flip_s = time.monotonic() - pushed_at
            assert flipped.model == v2
            # Flipped, but v1 stays loaded while the stream on it is in flight: the agent
            # itself reports v1's drain as started and not over.
            await eventually(lambda: reports_draining(api, testbed.agents["a"].agent_id, v1),
                             timeout_s=30, retrying=RETRY_OVER_HTTP, what=f"{v1} reported draining")
            assert held.running() and {v1, v2} <= await vllm_models(vllm_url)
            result = await held.release()
    finally:
        stop_watching.set()
        samples = await watcher
    print(f"\npush {pushed_at - pushing_at:.2f}s, then v2 served after {flip_s:.2f}s; "
          f"the stream: {result.chunks} chunks over {result.seconds:.1f}s")
    assert result.ok, result
    assert (result.adapter, result.models_seen, result.finish_reason) == (v1, {v1}, "length")
    assert result.text == undisturbed.text

    # v1 stayed in vLLM for as long as its stream ran, and leaves once it has ended.
    assert result.last_chunk_at is not None
    judged = [names for at, names in samples if at < result.last_chunk_at - END_MARGIN_S]
    assert judged and all(v1 in names for names in judged), judged

    async def v1_gone() -> bool:
        return v1 not in await vllm_models(vllm_url)

    await eventually(v1_gone, timeout_s=30, retrying=RETRY_OVER_HTTP,
                     what=f"{v1} unloaded after its stream")
    assert v2 in await vllm_models(vllm_url)
    after = await agent_a.complete(name)
    assert (after.adapter, after.text) == (v2, v2_reference.text)
