"""Routing rules kept current by ``route_changed`` deltas, read in full only on a gap.

Each event carries one rule's change and the tenant's rule revision, which the
registry numbers without gaps (``RouteChanged.route_revision``). Holding revision r of
a tenant, the agent applies r + 1 in place, ignores anything at or below r (a duplicate
or a late arrival) and re-reads every rule on anything else: a gap means a change it
did not see. Until that read lands, every event asks for a read too. Without revisions
(an older registry, or before the first snapshot) every event asks for a read.

A snapshot can be older than deltas already applied (a periodic resync read before
they arrived): a tenant whose held revision is above the snapshot's keeps its own
rules, so a delta is never undone by an older read. Only a delta applied while that
read was under way is kept so: one applied before the read started must show in it,
so a held revision the registry does not have (a revision from the future) gives way
to the snapshot at the next read instead of freezing the tenant's rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference_agent.control.contract import AliasApplier
from loraplane.events import DesiredState, RouteChanged


@dataclass
class RouteCounts:
    """What route events did here, for tests and benches."""

    applied: int = 0
    ignored: int = 0
    reads: int = 0


class RouteSync:
    """The tenants' rule revisions this agent holds, and the swap that writes rules."""

    def __init__(self, swapper: AliasApplier) -> None:
        self._swapper = swapper
        # tenant -> revision held; None: unknown (no snapshot with revisions yet, or a
        # gap since): events then ask for a read. A tenant missing from a known map had
        # no rule change when the snapshot was read: revision 0.
        self._held: dict[str, int] | None = None
        # tenant -> the tick at which its last delta was applied (see ``mark``).
        self._applied: dict[str, int] = {}
        self._tick = 0
        self.counts = RouteCounts()

    def mark(self) -> int:
        """Call before a full read of the rules; hand the result to ``take``."""
        return self._tick

    def on_event(self, event: RouteChanged) -> bool:
        """Apply ``event`` if it is the next revision; True if the rules must be read."""
        held, revision = self._held, event.route_revision
        if held is None or revision is None:
            self.counts.reads += 1
            return True
        current = held.get(event.tenant, 0)
        if revision <= current:
            self.counts.ignored += 1
            return False
        if revision != current + 1:
            self._held = None  # a change was missed: nothing held can be trusted now
            self.counts.reads += 1
            return True
        self._swapper.set_rule(event.tenant, event.kind, event.key, event.rule)
        held[event.tenant] = revision
        self._tick += 1
        self._applied[event.tenant] = self._tick
        self.counts.applied += 1
        return False

    def take(self, snapshot: DesiredState, since: int) -> None:
        """A full read of the rules, started at ``since`` (``mark``): it replaces them,
        but never with ones older than a delta applied while it was read."""
        revisions = snapshot.route_revisions
        if revisions is None:  # an older registry: no revisions, every event reads
            self._held = None
            self._swapper.set_rules(list(snapshot.routes))
            return
        held = self._held or {}
        keep = frozenset(t for t, r in held.items() if r > revisions.get(t, 0)
                         and self._applied.get(t, 0) > since)
        self._swapper.set_rules(list(snapshot.routes), keep)
        merged = dict(revisions)
        merged.update({tenant: held[tenant] for tenant in keep})
        self._held = merged
