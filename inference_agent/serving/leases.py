"""Per-version request leases: how the swap knows when an old version is idle.

``acquire`` is synchronous on purpose: the proxy resolves a route and takes its lease
with no await in between, so a flip can never slip between the two and let the old
version be unloaded under a request that is about to start on it.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class Lease:
    """One request's hold on one versioned name; ``release`` is idempotent."""

    __slots__ = ("_leases", "_released", "name", "tenant")

    def __init__(self, leases: Leases, name: str, tenant: str | None = None) -> None:
        self._leases = leases
        self.name = name
        self.tenant = tenant
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._leases._release(self.name, self.tenant)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


class Leases:
    """Counts of requests in flight per versioned name, and per tenant the names its
    requests hold (the loaded-adapter slots it keeps from eviction)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        # tenant -> {name: its leases of that name}
        self._tenants: dict[str, dict[str, int]] = {}
        self._idle: dict[str, asyncio.Event] = {}
        # Set whenever some name's count drops to zero: the cache waits on it when every
        # loaded version is busy and it needs one to become evictable.
        self._any_idle = asyncio.Event()

    def acquire(self, name: str, tenant: str | None = None) -> Lease:
        """A lease on ``name``, for a request of ``tenant`` (None: the control path's)."""
        self._counts[name] = self._counts.get(name, 0) + 1
        if tenant is not None:
            held = self._tenants.setdefault(tenant, {})
            held[name] = held.get(name, 0) + 1
        return Lease(self, name, tenant)

    def count(self, name: str) -> int:
        return self._counts.get(name, 0)

    def held_by(self, tenant: str) -> int:
        """How many names ``tenant``'s requests hold a lease on."""
        return len(self._tenants.get(tenant, ()))

    def holds(self, tenant: str, name: str) -> bool:
        return name in self._tenants.get(tenant, ())

    def busy(self) -> dict[str, int]:
        """Every name with requests in flight, and how many."""
        return dict(self._counts)

    async def wait_idle(self, name: str, timeout_s: float) -> bool:
        """Wait until ``name`` has no lease; True if it got there, False on timeout."""
        if self.count(name) == 0:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                while self.count(name) > 0:
                    # A fresh event per idle period: release pops and sets it, so a
                    # lease taken again before we wake gets a new one to wait on.
                    await self._idle.setdefault(name, asyncio.Event()).wait()
        except TimeoutError:
            return self.count(name) == 0
        return True

    async def wait_any_idle(self, timeout_s: float) -> bool:
        """Wait until some name's count drops to zero; False on timeout."""
        event = self._any_idle
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            return False
        return True

    def _release(self, name: str, tenant: str | None = None) -> None:
        if tenant is not None:
            held = self._tenants.get(tenant, {})
            if held.get(name, 0) > 1:
                held[name] -= 1
            else:
                held.pop(name, None)
                if not held:
                    self._tenants.pop(tenant, None)
        left = self._counts.get(name, 0) - 1
        if left > 0:
            self._counts[name] = left
            return
        self._counts.pop(name, None)
        event = self._idle.pop(name, None)
        if event is not None:
            event.set()
        self._any_idle.set()
        self._any_idle = asyncio.Event()
