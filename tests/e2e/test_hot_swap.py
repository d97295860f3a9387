"""A new version is swapped in under a running stream without disturbing it.

agent-a talks to vLLM through a relay that holds the stream's answer after its first
text until the swap is done (tests/support/relay.py): the stream is surely in flight
across the swap, on a machine of any speed. Then it runs to its natural end and is
compared whole with an undisturbed run.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.e2e.conftest import AgentVariant
from tests.e2e.steps import (
    LONG_TOKENS,
    direct,
    held_stream,
    new_adapter,
    publish,
    served_by,
    vllm_models,
)
from tests.support.fleet import Fleet
from tests.support.openai_client import OpenAIClient, eventually
from tests.support.registry_api import RegistryApi
from tests.support.relay import HELD_PROMPT, PausableRelay

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

# vLLM may unload v1 right after the agent sent the stream's last bytes, a moment before
# the client has read them: samples answered that close to the end are not judged.
END_MARGIN_S = 0.2


async def watch_models(vllm_url: str, stop: asyncio.Event) -> list[tuple[float, set[str]]]:
    """vLLM's model list until ``stop`` is set, each with the time its answer came."""
    samples: list[tuple[float, set[str]]] = []
    async with httpx.AsyncClient(timeout=60) as http:
        while not stop.is_set():
            names = await vllm_models(vllm_url, http)
            samples.append((time.monotonic(), names))
            await asyncio.sleep(0.05)
    return samples


async def test_push_during_a_stream_flips_new_requests_and_drains_the_stream(
        fleet: Fleet, api: RegistryApi, agent_a: OpenAIClient, vllm_a: OpenAIClient,
        unique: str, relay_a: PausableRelay, agent_a_variant: AgentVariant) -> None:
    name, vllm_url = f"swap-{unique}", fleet.vllms["a"].url
    v1, v2 = f"{name}@1", f"{name}@2"
    agent_a_variant.restart(fleet.agents["a"].variant(vllm_url=relay_a.url))
    await new_adapter(api, name, fleet.adapter_dir("a1"))
    await served_by(agent_a, name, v1)
    v1_reference = await direct(vllm_a, fleet.adapter_dir("a1"))
    v2_reference = await direct(vllm_a, fleet.adapter_dir("a2"))
    texts = {v1: v1_reference.text, v2: v2_reference.text}
    undisturbed = await direct(vllm_a, fleet.adapter_dir("a1"), stream=True,
                               prompt=HELD_PROMPT, max_tokens=LONG_TOKENS)

    stop_watching = asyncio.Event()
    watcher = asyncio.create_task(watch_models(vllm_url, stop_watching))
    try:
        async with held_stream(agent_a, name, relay_a) as held:
            await held.started()
            pushing_at = time.monotonic()
            assert await publish(api, name, fleet.adapter_dir("a2")) == 2
            pushed_at = time.monotonic()
            # Every answer on the way is v1's or v2's exact output, none fails.
            flipped = await served_by(agent_a, name, v2, timeout_s=60, texts=texts)
            flip_s = time.monotonic() - pushed_at
            assert flipped.model == v2
            # Flipped, but v1 stays loaded while the stream on it is in flight.
            await asyncio.sleep(1.0)  # time for a wrong drain to act
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

    await eventually(v1_gone, timeout_s=30, what=f"{v1} unloaded after its stream")
    assert v2 in await vllm_models(vllm_url)
    after = await agent_a.complete(name)
    assert (after.adapter, after.text) == (v2, v2_reference.text)
