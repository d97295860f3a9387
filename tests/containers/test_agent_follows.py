"""An agent with vLLM on the host follows the registry container: a push through the CLI
reaches the agent over NATS, it downloads from S3 through the published address, and
serves the new version."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from devharness.containers import ADMIN_TOKEN, ContainerStack
from devharness.openai_client import OpenAIClient
from devharness.testbed import AgentProcess, AgentSpec
from devharness.vllm import VllmServer
from loraplane.process import ProcessError
from tests.containers.test_registry_stack import TENANT, cli, create_adapter
from tests.e2e.steps import served_by

BASE_MODEL = "tiny-llama"


@dataclass
class HostAgent:
    agent: AgentProcess
    model_dir: Path
    inference_token: str


def create_token(stack: ContainerStack, body: dict[str, str]) -> str:
    response = httpx.post(f"{stack.registry_url}/v1/tokens", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 201, response.text
    secret: str = response.json()["secret"]
    return secret


@pytest.fixture(scope="package")
def host_agent(stack: ContainerStack, tiny_model: Path, shared_vllm: VllmServer,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostAgent]:
    """An agent on the host beside the run's shared vLLM (tests/vllm_fixtures.py),
    emptied of what earlier modules loaded."""
    work = tmp_path_factory.mktemp("containers-agent")
    shared_vllm.unload_all()
    with contextlib.ExitStack() as on_exit:
        try:
            token = create_token(stack, {"name": "containers-agent", "role": "agent",
                                         "agent_id": "agent-containers"})
            spec = AgentSpec(agent_id="agent-containers", vllm_url=shared_vllm.url,
                             base_model=BASE_MODEL, cache_dir=work / "cache",
                             base_model_config=tiny_model / "base" / "config.json",
                             registry=stack.registry_url, token=token,
                             nats_url=stack.nats_url, max_loaded=2,
                             max_lora_rank=shared_vllm.max_lora_rank)
            agent = AgentProcess(spec, work / "agents")
            on_exit.callback(agent.stop)
            agent.start()
        except ProcessError as exc:
            pytest.fail(f"the agent could not be started:\n{exc}", pytrace=False)
        inference = create_token(stack, {"name": "containers-client", "role": "inference",
                                          "tenant": TENANT})
        yield HostAgent(agent, tiny_model, inference)


async def test_a_cli_push_reaches_the_agent_which_serves_the_new_version(
        stack: ContainerStack, host_agent: HostAgent) -> None:
    await create_adapter(stack, "followed")
    adapters = host_agent.model_dir / "adapters"
    async with OpenAIClient(host_agent.agent.url, token=host_agent.inference_token) as client:
        for version, folder in ((1, adapters / "a1"), (2, adapters / "a2")):
            result = cli(stack, "push", "followed", str(folder), "--alias", "live")
            assert result.returncode == 0, result.stderr
            answer = await served_by(client, "followed", f"followed@{version}", timeout_s=180)
            assert answer.ok and answer.text, answer
