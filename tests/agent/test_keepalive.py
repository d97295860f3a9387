"""An idle kept-alive connection to the agent is closed by the client first: an agent
that closed it first would race the client's next request on it, and that request
would fail (httpx and the OpenAI SDK on it do not retry a request already sent)."""

from __future__ import annotations

from pathlib import Path

import httpx
from starlette.applications import Starlette

from inference_agent.http_server import KEEP_ALIVE_S, server_config
from inference_agent.settings import AgentSettings
from tests.agent.test_service import keys_file


def test_clients_drop_idle_connections_well_before_the_agent_does() -> None:
    # httpx's default, which the OpenAI SDK keeps; a margin for a slow event loop.
    expiry = httpx.Limits().keepalive_expiry
    assert expiry is not None and expiry + 10 < KEEP_ALIVE_S


def test_the_agent_serves_with_that_keep_alive(tmp_path: Path) -> None:
    watch = tmp_path / "watch"
    watch.mkdir()
    settings = AgentSettings(base_model="tiny-llama", watch_dir=watch,
                             cache_dir=tmp_path / "cache", keys_file=keys_file(tmp_path),
                             vllm_url="http://127.0.0.1:9", port=0, agent_id="gpu-1")
    config = server_config(Starlette(), settings)
    assert config.timeout_keep_alive == KEEP_ALIVE_S
