"""The registry's HTTP protocol hands request bodies to the application without the two
copies uvicorn makes of every chunk, and still delivers every byte in order: through a
real uvicorn server and socket, with a length, chunked, empty, and two requests on one
kept-alive connection."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import httpx
from starlette.types import Receive, Scope, Send

from registry_service.http_body import Chunks, UncopiedBodyProtocol
from registry_service.server import server_config
from registry_service.settings import RegistrySettings
from tests.agent.proxy_harness import serve_asgi


def test_one_chunk_is_handed_over_itself_and_several_are_joined_in_order() -> None:
    one = Chunks()
    piece = bytes(range(256)) * 1024
    one += piece
    assert len(one) == len(piece) and bytes(one) is piece
    several = Chunks()
    for part in (b"ab", b"", b"cde"):
        several += part
    assert len(several) == 5 and bytes(several) == b"abcde"
    assert bytes(Chunks()) == b"" and not Chunks()


class BodyRecorder:
    """An ASGI app that reads every request body and answers what it read."""

    def __init__(self) -> None:
        self.message_types: set[type] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        digest, size, messages = hashlib.sha256(), 0, 0
        while True:
            message = await receive()
            self.message_types.add(type(message["body"]))
            digest.update(message["body"])
            size, messages = size + len(message["body"]), messages + 1
            if not message.get("more_body"):
                break
        answer = f"{size} {digest.hexdigest()} {messages}".encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": answer})


class WatchedProtocol(UncopiedBodyProtocol):
    """Records what holds a request's chunks once uvicorn has added one."""

    holders: set[type] = set()

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        WatchedProtocol.holders.add(type(self.cycle.body))


async def _pieces(data: bytes, sizes: tuple[int, ...]) -> AsyncIterator[bytes]:
    position, turn = 0, 0
    while position < len(data):
        size = sizes[turn % len(sizes)]
        yield data[position:position + size]
        position, turn = position + size, turn + 1


def _expected(data: bytes) -> tuple[int, str]:
    return len(data), hashlib.sha256(data).hexdigest()


async def test_every_byte_arrives_in_order_through_a_real_server() -> None:
    app = BodyRecorder()
    data = bytes(range(251)) * (20 * 4096 + 7)  # about 20 MiB, not a multiple of anything
    async with serve_asgi(app, http=WatchedProtocol, lifespan="off") as url, \
            httpx.AsyncClient(base_url=url, timeout=60) as client:
        sized = await client.post("/", content=data)
        # No length: the client sends it chunked, in pieces of odd sizes.
        chunked = await client.post("/", content=_pieces(data, (1, 65_537, 300_001, 17)))
        empty = await client.post("/", content=b"")
        # The same kept-alive connection again: its request starts from uvicorn's own
        # empty bytearray, which the protocol replaces.
        again = await client.post("/", content=data[:1000])
    for response, sent in ((sized, data), (chunked, data), (empty, b""),
                           (again, data[:1000])):
        size, digest, messages = response.text.split()
        assert (int(size), digest) == _expected(sent)
        assert int(messages) >= 1
    assert int(sized.text.split()[2]) > 1  # a large body comes in many receive() calls
    assert app.message_types == {bytes}  # ASGI's type, not a bytearray nor Chunks
    assert WatchedProtocol.holders == {Chunks}  # never uvicorn's bytearray


def test_the_registry_serves_with_it() -> None:
    settings = RegistrySettings(
        database_url="sqlite:///unused.db", port=0, blob_dir="/tmp/unused-blobs",
        nats_url="nats://127.0.0.1:4222")
    assert server_config(settings).http is UncopiedBodyProtocol
