"""``return_large_buffers_to_the_os``: after it, a buffer of a few MiB is its own mmap
(returned to the OS when freed) even once a larger one was freed; before it, glibc's
dynamic threshold puts such a buffer on the heap, where freed memory stays."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import ctypes, json, sys
from registry_service.memory import return_large_buffers_to_the_os

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
fixed = return_large_buffers_to_the_os() if sys.argv[1] == "fixed" else None
big = bytearray(16 * 1024 * 1024)
del big  # freeing an mmapped block raises glibc's dynamic threshold to its size
before = libc.mallinfo2().hblkhd
part = bytearray(4 * 1024 * 1024)
print(json.dumps({"fixed": fixed, "mmapped_growth": libc.mallinfo2().hblkhd - before}))
"""


def _probe(mode: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True,
                          text=True, check=True)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_buffers_of_a_few_mib_stay_off_the_heap() -> None:
    assert _probe("default")["mmapped_growth"] == 0  # the creep's mechanism, on the heap
    fixed = _probe("fixed")
    assert fixed["fixed"] is True
    assert isinstance(fixed["mmapped_growth"], int) and fixed["mmapped_growth"] >= 4 * 1024**2


_IMPORTS = """
import json, sys
from registry_service.memory import import_nats_without_websockets
import_nats_without_websockets(sys.argv[1])
import registry_service.server
import nats.aio.transport
print(json.dumps({"aiohttp": "aiohttp" in sys.modules, "alembic": "alembic" in sys.modules,
                  "numpy": "numpy" in sys.modules,
                  "websocket": nats.aio.transport.aiohttp is not None}))
"""


def _imported(nats_url: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", _IMPORTS, nats_url], capture_output=True,
                          text=True, check=True, timeout=120)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_the_server_leaves_out_what_it_does_not_use() -> None:
    # Alembic until a migration runs, aiohttp unless NATS is reached by WebSocket: ~19 MiB.
    # numpy never (loraplane/lora/finite.py): ~11 MiB.
    assert _imported("nats://127.0.0.1:4222") == {"aiohttp": False, "alembic": False,
                                                  "numpy": False, "websocket": False}
    assert _imported("ws://127.0.0.1:8080") == {"aiohttp": True, "alembic": False,
                                                "numpy": False, "websocket": True}
