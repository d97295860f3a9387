"""The look-up of ``name@N`` for versions no alias points at: the registry, briefly cached."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from inference_agent.errors import NotServable
from inference_agent.node.registry_client import RegistryLink
from loraplane.events import VersionRef
from loraplane.naming import versioned_name

_Entry = tuple[float, VersionRef | str]


class VersionLookup:
    """``name@N`` for a version no alias points at: ask the registry, remember briefly.

    Versions are immutable, but an adapter may be deleted and re-created under the same
    name, so answers are kept for ``ttl_s`` only. A "no such version" is kept for
    ``miss_ttl_s`` so a client retrying a typo does not hammer the registry; an
    unreachable registry is never remembered.
    """

    def __init__(self, registry: RegistryLink | None, base_model: str, *,
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
