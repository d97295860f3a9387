"""Every call of the agent's vLLM client ends within its timeout: a call made without one
could wait forever on a vLLM that took the request and never answered."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inference_agent.errors import VllmUnavailable
from inference_agent.node.vllm_client import VllmClient


async def test_a_vllm_that_never_answers_is_unavailable_after_the_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # takes the request and never answers
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = VllmClient(f"http://127.0.0.1:{port}", timeout_s=0.5)
    try:
        for call in (client.load("a", Path("/x")), client.unload("a"), client.models()):
            # The client's own timeout must end each call; wait_for only keeps a client
            # without one from hanging the test.
            with pytest.raises(VllmUnavailable, match="timed out"):
                await asyncio.wait_for(call, timeout=30)
    finally:
        await client.aclose()
        server.close()
