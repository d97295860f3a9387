"""The proxy's client to vLLM: what a vLLM that cannot be reached, or does not answer,
becomes for the client. Real sockets; no vLLM is needed for either."""

from __future__ import annotations

import asyncio
import socket

from inference_agent.serving.openai_errors import ProxyError
from inference_agent.serving.upstream import Upstream


async def test_a_vllm_that_does_not_answer_in_time_is_a_504() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # reads nothing, answers nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream = Upstream(f"http://127.0.0.1:{port}", request_timeout_s=0.2,
                        connect_timeout_s=5)
    try:
        answer = await upstream.post("/v1/completions", b"{}", {})
        assert isinstance(answer, ProxyError)
        assert (answer.status, answer.code) == (504, "vllm_timeout")
        assert accepted, "the request reached the server"
    finally:
        await upstream.aclose()
        server.close()
        for writer in accepted:
            writer.close()
        await server.wait_closed()


async def test_a_vllm_that_cannot_be_reached_is_a_503() -> None:
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    upstream = Upstream(f"http://127.0.0.1:{port}", request_timeout_s=5, connect_timeout_s=5)
    try:
        for answer in (await upstream.post("/v1/completions", b"{}", {}),
                       await upstream.get("/health", 5)):
            assert isinstance(answer, ProxyError)
            assert (answer.status, answer.code) == (503, "vllm_unavailable")
    finally:
        await upstream.aclose()
