"""A byte relay on uvloop: the least a proxy written in Python can do per request.

Each client connection gets one connection of its own to the upstream, and bytes go
across both ways as they arrive: no HTTP parsing, no routing, no JSON, no second
buffer. ``bench/agent_proxy_overhead.py --floor-proxies`` puts it in front of vLLM
beside the agent, so the agent's added latency can be read against what one more hop
through a Python process on the same event loop costs on this machine at the least.

    python -m bench.tcp_relay --port 8100 --upstream 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import cast

import uvloop


class Pipe(asyncio.Protocol):
    """One side of a relayed connection: what it receives, its peer writes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: Pipe | None = None
        self.pending: list[bytes] = []  # received before the peer connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=256 * 1024)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
        else:
            peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    # The peer's reading stops while this side cannot take more: memory stays bounded.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class Client(Pipe):
    """A client's connection: it opens its own upstream connection as it arrives."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self.host, self.port = host, port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        assert self.transport is not None
        try:
            _, upstream = await asyncio.get_running_loop().create_connection(
                Pipe, self.host, self.port)
        except OSError:
            self.transport.close()
            return
        upstream.peer, self.peer = self, upstream
        assert upstream.transport is not None
        for data in self.pending:
            upstream.transport.write(data)
        self.pending.clear()
        if self.transport.is_closing():
            upstream.transport.close()


async def serve(port: int, upstream: str) -> None:
    host, _, upstream_port = upstream.rpartition(":")
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(host, int(upstream_port)),
                                      "127.0.0.1", port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"relaying 127.0.0.1:{port} -> {upstream}", flush=True)
    await stop.wait()
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="host:port")
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.upstream))


if __name__ == "__main__":
    main()
