"""Keep the registry's memory from creeping up from one upload to the next.

An upload passes through buffers of a few MiB (multipart parts, hashing pieces), allocated
and freed in worker threads. glibc's malloc serves an allocation that large with its own
``mmap`` and gives it back on ``free``, until the first such block is freed: then it raises
its threshold to that size ("dynamic mmap threshold"), and every later buffer is carved
out of the heap instead. Freed heap memory is only returned from the top, so each upload
left some behind (measured with tracemalloc and ``mallinfo2``: Python's own allocations
went back to zero between uploads while the heap kept 15-22 MiB free but not returned).
Fixing the threshold turns the dynamic adjustment off.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

# mallopt parameters of glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Large enough that ordinary objects never pay for an mmap, small enough that every
# upload buffer gets one.
MMAP_THRESHOLD_BYTES = 256 * 1024


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
                and mallopt(_M_TRIM_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1)
    if not done:
        log.warning("could not fix malloc's mmap threshold; memory may creep across uploads")
    return done
