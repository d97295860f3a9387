"""A running agent keeps long work off its event loop: ``/metrics`` is rendered on a
worker thread (hundreds of adapters' labels make a long text), and what start-up built
is frozen out of the garbage collector's full passes (which hold the GIL, and so the
loop, for as long as they scan). A real agent beside the vLLM stand-in; the thread and
the collector's state are checked, never a duration."""

from __future__ import annotations

import gc
import hashlib
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from devharness.vllm_standin import StandIn, create_app
from inference_agent.service import Agent
from inference_agent.settings import AgentSettings
from tests.agent.loop_support import running_agent, serve_app
from tests.loop_steps import recording_thread

BASE = "tiny-llama"


@asynccontextmanager
async def local_agent(tmp_path: Path) -> AsyncIterator[Agent]:
    """An agent of a watched folder (no registry), ready."""
    (tmp_path / "watch").mkdir()
    keys = tmp_path / "keys"
    keys.write_text(f"local {hashlib.sha256(b'lp_local').hexdigest()}\n")
    async with serve_app(create_app(StandIn(BASE))) as vllm_url:
        settings = AgentSettings(vllm_url=vllm_url, base_model=BASE, agent_id="off-loop",
                                 port=0, cache_dir=tmp_path / "cache",
                                 watch_dir=tmp_path / "watch", keys_file=keys)
        async with running_agent(settings, ready_timeout_s=60) as agent:
            yield agent


async def test_metrics_are_rendered_off_the_loop(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    async with local_agent(tmp_path) as agent:
        threads: list[threading.Thread] = []
        monkeypatch.setattr(agent.metrics, "render",
                            recording_thread(agent.metrics.render, threads))
        async with httpx.AsyncClient(base_url=str(agent.url)) as client:
            response = await client.get("/metrics")
        assert response.status_code == 200
        assert "loraplane_agent_" in response.text
        assert len(threads) == 1 and threads[0] is not threading.main_thread()


async def test_what_start_up_built_is_frozen_out_of_full_collections(
        tmp_path: Path) -> None:
    gc.unfreeze()
    async with local_agent(tmp_path) as agent:
        assert agent.ready.is_set()
        assert gc.get_freeze_count() > 0
    # Stopped: the agent's objects can be collected again.
    assert gc.get_freeze_count() == 0
