"""Small network helpers shared by the embedded services and the tests."""

from __future__ import annotations

import re
import socket
from contextlib import ExitStack

# ``scheme://user:password@`` or ``scheme://token@``: everything before the @ is secret.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def mask_url(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``."""
    return _URL_CREDENTIALS.sub(r"\g<scheme>***@", text)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that were free a moment ago.

    All sockets stay bound until every port is chosen, so the ports differ from each
    other. Another process may still take one before the caller binds it; callers
    that start servers should treat "address in use" as a reason to retry.
    """
    with ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def free_port(host: str = "127.0.0.1") -> int:
    """One TCP port that was free a moment ago (see ``free_ports``)."""
    return free_ports(1, host)[0]
