"""``loraplane`` with TCP_NODELAY on every listening socket it creates.

The agent's listening socket comes from ``socket.create_server``, whose protocol number
is 0, so asyncio's transports skip TCP_NODELAY on the connections it accepts (asyncio
only sets it when ``sock.proto == IPPROTO_TCP``). A response written in two pieces
(headers, then body) then waits for the client's delayed ACK. Setting the option on
the listening socket (Linux copies it to accepted sockets) is the proposed fix in
``inference_agent/service.py``, where it has since landed; this wrapper let the
benchmarks measure it before it did (``bench.agent_publish_to_served
--agent-tcp-nodelay`` still takes it, a no-op now).

    python -m bench.agent_nodelay agent --agent-id ... (the arguments of ``loraplane``)
"""

from __future__ import annotations

import socket
from typing import Any

_create_server = socket.create_server


def create_server_nodelay(*args: Any, **kwargs: Any) -> socket.socket:
    sock = _create_server(*args, **kwargs)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def main() -> None:
    socket.create_server = create_server_nodelay
    from loraplane_cli.main import main as loraplane_main  # noqa: PLC0415

    loraplane_main()


if __name__ == "__main__":
    main()
