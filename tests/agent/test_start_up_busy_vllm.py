"""A vLLM that answered once and then fails a few calls during the agent's start-up is
waited out: the agent retries its start-up snapshot and becomes ready, instead of
ending with the error. (A hundred agents starting beside busy servers hit this.)

A real embedded registry over HTTP and NATS, a real agent in this loop, and the vLLM
stand-in (devharness/vllm_standin.py) behind a wrapper that fails chosen calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.types import Receive, Scope, Send

from devharness.services import NatsService
from devharness.vllm_standin import StandIn, create_app
from inference_agent.settings import AgentSettings
from tests.agent.loop_support import running_agent, serve_app, served_registry

BASE = "tiny-llama"


class FailingModelLists:
    """Answers ``GET /v1/models`` with 503 on the calls whose numbers (from 1) are in
    ``failing``; everything else goes to the stand-in."""

    def __init__(self, app: Any, failing: set[int]) -> None:
        self.app, self.failing, self.calls = app, failing, 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/models":
            self.calls += 1
            if self.calls in self.failing:
                await send({"type": "http.response.start", "status": 503,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"busy"})
                return
        await self.app(scope, receive, send)


async def test_vllm_failing_after_its_first_answer_does_not_end_start_up(
        tmp_path: Path, nats: NatsService) -> None:
    # Call 1 is the readiness poll; 2 and 3 are the snapshot's repair and its first retry.
    vllm = FailingModelLists(create_app(StandIn(BASE)), failing={2, 3})
    async with served_registry(tmp_path, nats) as reg, serve_app(vllm) as vllm_url:
        settings = AgentSettings(
            registry=reg.url, token=await reg.agent_token(), nats_url=None,
            vllm_url=vllm_url, base_model=BASE, agent_id="starting", port=0,
            cache_dir=tmp_path / "cache", credentials_refresh_s=3600,
            retry_base_s=0.05, retry_max_s=0.2)
        async with running_agent(settings, ready_timeout_s=60) as agent:
            assert agent.ready.is_set() and not agent.draining
            # Both failures were met and waited out, and the repair then went through.
            assert vllm.calls >= 4
