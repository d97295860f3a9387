"""An idle kept-alive connection to vLLM is dropped by the agent's client before vLLM
closes it: a server that closes it first races the client's next call on it ("Server
disconnected"), which is not retried. bench/fanout.py lost an agent's start-up to that
race, against the vLLM stand-in (uvicorn's default of 5 s, as vLLM's)."""

from __future__ import annotations

import uvicorn

from devharness.vllm_standin import StandIn, create_app
from inference_agent.node.vllm_client import VllmClient
from inference_agent.serving.upstream import KEEPALIVE_S

VLLM_KEEP_ALIVE_S = 5  # vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE default


def test_the_agent_drops_idle_connections_before_vllm_does() -> None:
    standin = uvicorn.Config(create_app(StandIn()))
    assert standin.timeout_keep_alive == VLLM_KEEP_ALIVE_S
    assert KEEPALIVE_S <= VLLM_KEEP_ALIVE_S - 2  # a margin for a slow event loop


async def test_the_vllm_client_uses_that_expiry() -> None:
    client = VllmClient("http://vllm.invalid")
    try:
        assert client.keepalive_s == KEEPALIVE_S
    finally:
        await client.aclose()

