"""An agent restarted with a new cache dir beside a vLLM that kept the old run's versions."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from devharness.vllm import VllmServer
from devharness.waiting import eventually
from inference_agent.settings import AgentSettings
from tests.agent.loop_support import running_agent
from tests.agent.test_service import BASE, complete, keys_file

pytestmark = pytest.mark.vllm


async def _served(settings: AgentSettings, model: str) -> tuple[int, str | None, str]:
    async with running_agent(settings) as agent, httpx.AsyncClient(
            base_url=str(agent.url), timeout=60) as client:
        async def routed() -> tuple[int, str | None, str] | None:
            answer = await complete(client, model, "lp_local")
            # 404 until the watched folder is copied and routed, after "ready".
            return None if answer[0] == 404 else answer

        return await eventually(routed, timeout_s=60, what=f"{model} routed")


async def test_a_previous_runs_version_is_not_taken_for_this_runs(
        tmp_path: Path, tiny_model: Path, vllm_server: VllmServer) -> None:
    adapters, watch = tiny_model / "adapters", tmp_path / "watch"
    shutil.copytree(adapters / "a1", watch / "restarted")

    def settings(run: str) -> AgentSettings:
        # A new cache dir numbers the folder's versions from 1 again: this run's
        # restarted@1 holds other weights than the one vLLM kept from the last run.
        return AgentSettings(base_model=BASE, watch_dir=watch, vllm_url=vllm_server.url,
                             cache_dir=tmp_path / f"cache-{run}", port=0,
                             keys_file=keys_file(tmp_path), agent_id=f"gpu-{run}")

    first = await _served(settings("1"), "restarted")
    assert first[:2] == (200, "restarted@1")
    assert "restarted@1" in vllm_server.loaded_adapters(), "a stopped agent leaves it"
    shutil.rmtree(watch / "restarted")
    shutil.copytree(adapters / "a2", watch / "restarted")
    second = await _served(settings("2"), "restarted")
    assert second[:2] == (200, "restarted@1")
    assert second[2] != first[2], "served the previous run's weights"
