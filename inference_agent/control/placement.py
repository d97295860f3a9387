"""Which adapters this agent owns by rendezvous placement, kept pinned in the cache.

An adapter with a ``replicas`` setting is kept hot on its owners only: the
``replicas`` live agents of the base model that rank highest for it (see
``loraplane.placement``, the same function the registry's fleet view uses). An owner
pins it, so the swap loads a new version before the alias flips to it and LRU never
evicts it; every other agent still loads it at its first request, as before. An
adapter without the setting is never pinned by placement (today's behaviour).

The fleet is the registry's list of live agents: a ``fleet_changed`` event brings it
at each join or leave (the reconciler's ``on_event``), and every desired-state read
brings it too, which repairs a lost event. Losing an adapter only unpins it: it
stays loaded until LRU needs the slot, so requests in flight and a quick return of
ownership cost nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from loraplane.placement import owns

log = logging.getLogger(__name__)


class Pins(Protocol):
    def pin(self, adapter: str) -> None: ...

    def unpin(self, adapter: str) -> None: ...


class Placement:
    """This agent's share of the placed adapters, applied as cache pins."""

    def __init__(self, agent_id: str, pins: Pins, *, configured: Iterable[str] = (),
                 on_change: Callable[[], None] | None = None) -> None:
        """``on_change`` hears of every adapter gained or lost: the status report shows
        what this agent owns, even when nothing is loaded or unloaded for it."""
        self.agent_id = agent_id
        self._on_change = on_change or (lambda: None)
        self._pins = pins
        # ``--pin`` adapters stay pinned whatever placement says.
        self._configured = set(configured)
        self._fleet: tuple[str, ...] = ()
        self._owned: set[str] = set()
        self.gained = 0
        self.lost = 0

    def set_fleet(self, agents: Iterable[str]) -> None:
        """The live agents of the base model, as the registry last listed them."""
        fleet = tuple(sorted(set(agents)))
        if fleet != self._fleet:
            log.info("placement: fleet of %d agent(s): %s", len(fleet), ", ".join(fleet))
        self._fleet = fleet

    def owned(self) -> set[str]:
        return set(self._owned)

    def is_owned(self, adapter: str) -> bool:
        return adapter in self._owned

    def place(self, adapter: str, replicas: int | None) -> bool:
        """Recompute whether ``adapter`` (None: deleted or unplaced) is ours, pin or
        unpin it if that changed, and return whether it is ours now."""
        mine = replicas is not None and owns(self.agent_id, self._fleet, adapter, replicas)
        was = adapter in self._owned
        if mine and not was:
            self._owned.add(adapter)
            self._pins.pin(adapter)
            self.gained += 1
            log.info("placement: %s is now kept hot here", adapter)
        elif was and not mine:
            self._owned.discard(adapter)
            if adapter not in self._configured:
                self._pins.unpin(adapter)
            self.lost += 1
            log.info("placement: %s moved to other agents; loaded on demand here", adapter)
        if mine != was:
            self._on_change()
        return mine
