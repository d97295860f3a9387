"""The test client drops an idle connection before vLLM (uvicorn) closes it: reusing one
as the server closes it fails the request on it, which CI saw on the direct vLLM path of
the proxy benchmark."""

from __future__ import annotations

import uvicorn
from starlette.applications import Starlette

from devharness.openai_client import KEEPALIVE_EXPIRY_S, OpenAIClient


async def test_the_client_expires_idle_connections_before_the_server_does() -> None:
    server_keep_alive = uvicorn.Config(Starlette()).timeout_keep_alive
    assert server_keep_alive - 2 >= KEEPALIVE_EXPIRY_S  # a margin for a slow event loop
    async with OpenAIClient("http://127.0.0.1:9") as client:
        pool = client.http._transport._pool  # type: ignore[attr-defined]
        assert pool._keepalive_expiry == KEEPALIVE_EXPIRY_S
