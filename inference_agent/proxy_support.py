"""Per-request bookkeeping of the proxy, and the look-up of versions no alias points at."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from inference_agent.errors import NotServable
from inference_agent.leases import Lease
from inference_agent.metrics import AgentMetrics
from inference_agent.registry_client import RegistryClient
from inference_agent.routing import Target
from loraplane.events import VersionRef
from loraplane.naming import versioned_name

ADAPTER_HEADER = "X-Loraplane-Adapter"
# Metric label of a request refused before it was resolved. Not a slug, so it cannot
# collide with an adapter's name, and client-chosen names never become label values.
UNRESOLVED_LABEL = "_unresolved"


@dataclass
class ProxyCall:
    """One proxied request: what serves it, its lease, and its metrics; closed once."""

    metrics: AgentMetrics
    started: float = field(default_factory=time.perf_counter)
    label: str = UNRESOLVED_LABEL
    served: str | None = None
    lease: Lease | None = None
    closed: bool = False

    def bind(self, target: Target, lease: Lease | None) -> None:
        self.label = target.adapter or target.model_name
        self.served = target.model_name
        self.lease = lease

    def headers(self) -> dict[str, str]:
        return {ADAPTER_HEADER: self.served} if self.served is not None else {}

    def done(self, status: int, reason: str | None) -> None:
        """Release the lease and record the request; later calls do nothing."""
        if self.closed:
            return
        self.closed = True
        if self.lease is not None:
            self.lease.release()
        elapsed = time.perf_counter() - self.started
        self.metrics.requests.labels(adapter=self.label, status=str(status)).inc()
        self.metrics.request_latency.labels(adapter=self.label).observe(elapsed)
        if reason is not None:
            self.metrics.request_errors.labels(adapter=self.label, reason=reason).inc()


_Entry = tuple[float, VersionRef | str]


class VersionLookup:
    """``name@N`` for a version no alias points at: ask the registry, remember briefly.

    Versions are immutable, but an adapter may be deleted and re-created under the same
    name, so answers are kept for ``ttl_s`` only. A "no such version" is kept for
    ``miss_ttl_s`` so a client retrying a typo does not hammer the registry; an
    unreachable registry is never remembered.
    """

    def __init__(self, registry: RegistryClient | None, base_model: str, *,
                 ttl_s: float = 30.0, miss_ttl_s: float = 5.0, max_entries: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.base_model = base_model
        self.ttl_s = ttl_s
        self.miss_ttl_s = miss_ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[tuple[str, int], _Entry] = OrderedDict()

    async def get(self, adapter: str, version: int) -> VersionRef:
        """The version's ref; NotServable if it does not exist for this base model."""
        key = (adapter, version)
        entry = self._entries.get(key)
        if entry is None or entry[0] <= self._clock():
            entry = await self._fetch(adapter, version)
            self._remember(key, entry)
        answer = entry[1]
        if isinstance(answer, str):
            raise NotServable(answer, detail={"adapter": adapter, "version": version})
        return answer

    async def _fetch(self, adapter: str, version: int) -> _Entry:
        name = versioned_name(adapter, version)
        if self.registry is None:
            return (self._clock() + self.miss_ttl_s,
                    f"{name} is not routed here and this agent has no registry to ask")
        try:
            ref = await self.registry.version(adapter, version)
        except NotServable as exc:
            return (self._clock() + self.miss_ttl_s, f"{name} does not exist: {exc.message}")
        if ref.base_model != self.base_model:
            return (self._clock() + self.ttl_s,
                    f"{name} is for base model {ref.base_model!r}, this agent serves "
                    f"{self.base_model!r}")
        return (self._clock() + self.ttl_s, ref)

    def _remember(self, key: tuple[str, int], entry: _Entry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
