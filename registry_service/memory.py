"""Keep the registry's memory from creeping up from one upload to the next.

An upload passes through buffers of a few MiB (multipart parts, hashing pieces), allocated
and freed in worker threads. glibc's malloc serves an allocation that large with its own
``mmap`` and gives it back on ``free``, until the first such block is freed: then it raises
its threshold to that size ("dynamic mmap threshold"), and every later buffer is carved
out of the heap instead. Freed heap memory is only returned from the top, so each upload
left some behind (measured with tracemalloc and ``mallinfo2``: Python's own allocations
went back to zero between uploads while the heap kept 15-22 MiB free but not returned).
Fixing the threshold turns the dynamic adjustment off.

Where the threshold sits matters for CPU as well: every allocation above it is an ``mmap``,
page faults on first touch and a ``munmap`` on ``free``. The body arrives in pieces of up
to 256 KiB (uvloop's read size) and the parser copies each, so those must stay below it
(at 256 KiB they did not, and a GiB upload paid seconds of page faults); part buffers
(5 MiB and up, S3's minimum) and the 1 MiB+ scratch buffer of a streamed file stay above
it and go back to the system after each upload. Freed heap memory above the trim
threshold at the top of the heap is returned; below it, it is kept for the next pieces.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

# mallopt parameters of glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Above the body's pieces (256 KiB, plus a header), at most the size of a part or a
# streamed file's scratch buffer (1 MiB and more).
MMAP_THRESHOLD_BYTES = 1024 * 1024
# The heap may keep this much free at its top (per malloc arena), so that a few pieces
# come and go without a trim and page faults each time.
TRIM_THRESHOLD_BYTES = 1024 * 1024


def return_large_buffers_to_the_os() -> bool:
    """Fix malloc's thresholds (glibc only); False where there is no ``mallopt``."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:  # another C library (musl): nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
    if not done:
        log.warning("could not fix malloc's mmap threshold; memory may creep across uploads")
    return done


def import_nats_without_websockets(nats_url: str | None) -> None:
    """Import nats-py without aiohttp (9 MiB of RSS), unless NATS is reached by WebSocket.

    nats-py imports aiohttp only for its WebSocket transport, and leaves it out when the
    import fails. Call before anything imports ``nats``; aiohttp itself stays importable.
    """
    if "nats" in sys.modules or "aiohttp" in sys.modules or "ws://" in (nats_url or "") \
            or "wss://" in (nats_url or ""):
        return
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # ``import aiohttp`` fails
    try:
        import nats  # noqa: F401, PLC0415
    finally:
        del sys.modules["aiohttp"]
