"""Which adapters this agent owns by rendezvous placement, kept pinned in the cache.

An adapter with a ``replicas`` setting is kept hot on its owners only: the
``replicas`` live agents of the base model that rank highest for it (see
``loraplane.placement``, the same function the registry's fleet view uses). An owner
pins it, so the swap loads a new version before the alias flips to it and LRU never
evicts it; every other agent leaves it cold (the reconciler's ``_readiness``: the alias
flips without a download) and fetches and loads it at its first request, unless it has
it loaded. An adapter without the setting is never pinned by placement and every new
version of it is fetched before the flip.

An agent keeps at most ``slots`` owned adapters pinned: its ``--max-loaded`` minus one
slot that stays free for on-demand loads, minus its ``--pin`` adapters. Pins are never
evicted, so pinning more would leave no slot for anything else (every on-demand load,
and every owned adapter past the limit, would answer 503 ``capacity_exhausted``) and
retrying would not help: nothing frees a pinned slot. An owned adapter past the limit
is *over capacity*: downloaded with each new version (warm) and loaded on demand like
any other, logged once, reported in the status (``over_capacity``) and counted in
``loraplane_agent_owned_adapters{state="over_capacity"}``. It is kept hot as soon as a
slot frees (an owned adapter lost, deleted or unplaced), first come first served, so
what is hot stays hot.

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

from inference_agent.metrics import AgentMetrics
from loraplane.placement import owns

log = logging.getLogger(__name__)


class Pins(Protocol):
    def pin(self, adapter: str) -> None: ...

    def unpin(self, adapter: str) -> None: ...


class Placement:
    """This agent's share of the placed adapters, applied as cache pins."""

    def __init__(self, agent_id: str, pins: Pins, *, configured: Iterable[str] = (),
                 slots: int | None = None, requeue: Callable[[str], None] | None = None,
                 metrics: AgentMetrics | None = None,
                 on_change: Callable[[], None] | None = None) -> None:
        """``slots``: how many owned adapters may be pinned (None: no limit).
        ``requeue(adapter)`` asks for an adapter's reconcile: an over-capacity adapter's,
        when a slot frees. ``on_change`` hears of every adapter gained or lost: the
        status report shows what this agent owns, even when nothing is loaded for it."""
        self.agent_id = agent_id
        self._on_change = on_change or (lambda: None)
        self._pins = pins
        self._requeue = requeue
        self._metrics = metrics
        # ``--pin`` adapters stay pinned whatever placement says, and take no slot here.
        self._configured = set(configured)
        self.slots = slots
        self._fleet: tuple[str, ...] = ()
        self._fleet_seq = 0  # the registry event seq the fleet above reflects
        self._owned: set[str] = set()
        self._kept: set[str] = set()
        self.gained = 0
        self.lost = 0

    def set_fleet(self, agents: Iterable[str], seq: int | None = None, *,
                  reset: bool = False) -> bool:
        """The live agents of the base model as the registry listed them at its event
        ``seq`` (a fleet event's own, or a snapshot's ``event_seq``); whether taken.

        A list older than the one held is ignored: the relay may publish two fleet
        events out of order (a newer fleet of 100 published before the older fleet of 99
        would leave every agent on 99), and an adapter's read may bring a newer fleet
        than the events not yet received. ``reset`` (a full resync) takes the list
        whatever its ``seq``: the registry's history may have restarted. ``seq`` None
        (no number known) takes it too."""
        if seq is not None and seq < self._fleet_seq and not reset:
            return False
        if seq is not None:
            self._fleet_seq = seq
        fleet = tuple(sorted(set(agents)))
        if fleet != self._fleet:
            log.info("placement: fleet of %d agent(s): %s", len(fleet), ", ".join(fleet))
        self._fleet = fleet
        return True

    def owned(self) -> set[str]:
        return set(self._owned)

    def kept(self) -> set[str]:
        """Owned adapters pinned here."""
        return set(self._kept)

    def over_capacity(self) -> set[str]:
        """Owned adapters not pinned for lack of slots: loaded on demand."""
        return self._owned - self._kept

    def has_room(self) -> bool:
        return self.slots is None or len(self._kept - self._configured) < self.slots

    def place(self, adapter: str, replicas: int | None) -> bool:
        """Recompute whether ``adapter`` (None: deleted or unplaced) is ours, pin it if
        ours and a slot is free, unpin it if no longer ours; whether it is kept hot."""
        mine = replicas is not None and owns(self.agent_id, self._fleet, adapter, replicas)
        was = adapter in self._owned
        if not mine:
            if was:
                self._release(adapter)
        elif not was:
            self._owned.add(adapter)
            self.gained += 1
            self._keep(adapter, first=True)
        elif adapter not in self._kept:
            self._keep(adapter, first=False)
        self._after_change(adapter)
        if mine != was:
            self._on_change()
        return adapter in self._kept

    def _after_change(self, adapter: str) -> None:
        waiting = self.over_capacity() - {adapter}
        if waiting and self.has_room() and self._requeue is not None:
            for name in sorted(waiting):  # the first of them to run takes the slot
                self._requeue(name)
        if self._metrics is not None:
            gauge = self._metrics.owned_adapters
            gauge.labels(state="kept_hot").set(len(self._kept))
            gauge.labels(state="over_capacity").set(len(self.over_capacity()))

    def _keep(self, adapter: str, *, first: bool) -> None:
        if adapter in self._configured or self.has_room():
            self._kept.add(adapter)
            self._pins.pin(adapter)
            log.info("placement: %s is now kept hot here", adapter)
        elif first:
            log.warning("placement: %s is owned here but all %d slot(s) for owned adapters "
                        "are taken (--max-loaded less one for on-demand loads and the "
                        "--pin adapters); it loads on demand until one frees", adapter,
                        self.slots or 0)

    def _release(self, adapter: str) -> None:
        self._owned.discard(adapter)
        if adapter in self._kept:
            self._kept.discard(adapter)
            if adapter not in self._configured:
                self._pins.unpin(adapter)
        self.lost += 1
        log.info("placement: %s moved to other agents; loaded on demand here", adapter)
