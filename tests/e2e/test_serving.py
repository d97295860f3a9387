"""A pushed version reaches vLLM through the agent and answers exactly as vLLM does."""

from __future__ import annotations

import pytest

from devharness.openai_client import OpenAIClient
from devharness.testbed import Testbed
from loraplane.client import AsyncRegistryClient
from tests.e2e.steps import direct, new_adapter, served_by, vllm_models

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


async def test_pushed_version_is_served_with_vllms_own_output(
        testbed: Testbed, api: AsyncRegistryClient, agent_a: OpenAIClient, vllm_a: OpenAIClient,
        unique: str) -> None:
    name = f"serve-{unique}"
    assert await new_adapter(api, name, testbed.adapter_dir("a1")) == 1

    served = await served_by(agent_a, name, f"{name}@1")
    assert served.model == f"{name}@1"
    assert f"{name}@1" in await vllm_models(testbed.vllms["a"].url)
    # The same files loaded into the same vLLM by hand, and the base model: one at a time.
    reference = await direct(vllm_a, testbed.adapter_dir("a1"))
    base = await vllm_a.complete(testbed.base_model)
    assert base.ok, base
    assert served.text == reference.text
    assert served.text != base.text

    # Every way of naming the version gives the same weights, and says which it was.
    for model in (f"{name}@live", f"{name}@1"):
        again = await agent_a.complete(model)
        assert (again.adapter, again.text) == (f"{name}@1", reference.text)
    streamed = await agent_a.stream(name, max_tokens=16)
    assert (streamed.adapter, streamed.text, streamed.finish_reason) == (
        f"{name}@1", reference.text, "length")
    chat = await agent_a.chat(name, "Which version is this?")
    assert chat.ok and chat.adapter == f"{name}@1" and chat.model == f"{name}@1"

    # No adapter named: the base model, through the agent too.
    via_agent = await agent_a.complete(None)
    assert (via_agent.adapter, via_agent.text) == (testbed.base_model, base.text)


async def test_unknown_adapter_is_an_openai_style_404(agent_a: OpenAIClient,
                                                     unique: str) -> None:
    missing = await agent_a.complete(f"missing-{unique}")
    assert missing.status == 404
    assert missing.error is not None
    assert set(missing.error) == {"message", "type", "param", "code"}
    assert f"missing-{unique}" in missing.error["message"]
