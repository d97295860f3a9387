"""``loraplane.client`` (the CLI's and the Python client's requests) uses httpx; each
request must not pay for an import. httpcore looks for sniffio on every lock and event it
sets up (four per request); without it installed, each look is a failed import that
searches sys.path: about 0.3 ms of CPU per request on these machines."""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

import httpx

_RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"


class _Recorder(importlib.abc.MetaPathFinder):
    """Sees every import that reaches the finders, i.e. is not already in sys.modules."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        self.names.append(fullname)
        return None


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(_RESPONSE)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()  # the client closed its connection


async def test_an_httpx_request_imports_nothing() -> None:
    server = await asyncio.start_server(_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    recorder = _Recorder()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            await client.get("/")  # the first request may import what it needs once
            sys.meta_path.insert(0, recorder)
            try:
                for _ in range(3):
                    assert (await client.get("/")).text == "ok"
                async with client.stream("GET", "/") as response:
                    assert await response.aread() == b"ok"
            finally:
                sys.meta_path.remove(recorder)
    finally:
        server.close()
    assert recorder.names == []
