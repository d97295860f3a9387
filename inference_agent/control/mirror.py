"""The agent's copy of the registry's desired state, kept current by events.

Every event already carries what an agent needs to act (``loraplane.events``), so
reading the registry after each one would make the registry do N agents x M events
reads. Instead the reconciler keeps this mirror: each registry read (a full snapshot,
or one adapter) replaces entries wholesale, and an alias move updates its entry in
place when the move can be trusted, that is when it is the very next revision of that
alias. Anything else (a gap in the revisions, an alias or adapter the mirror does not
know, a deletion, a placement change, another tenant's name) drops the entry, and the next
reconcile of that adapter reads it from the registry: only what changed, only when it
must. A move at or below the revision the mirror holds is a duplicate or a late
arrival and changes nothing. The periodic full resync replaces the mirror, which is
what repairs anything the events could not tell (a registry restored from a backup).
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplane.events import AdapterUpdated, DesiredAdapter, DesiredAlias, Event, VersionPublished


class _Missing:
    """The mirror cannot answer: read the registry."""


MISSING = _Missing()
Entry = DesiredAdapter | None | _Missing


@dataclass
class MirrorCounts:
    """What events did to the mirror, for the status of this design (tests, benches)."""

    applied: int = 0
    ignored: int = 0
    dropped: int = 0


class DesiredMirror:
    """adapter -> its desired state (None: known not to exist), for one base model."""

    def __init__(self) -> None:
        self._known: dict[str, DesiredAdapter | None] = {}
        # Revisions of aliases a trusted move removed: desired state lists only aliases
        # that point at a version, so without this a removal's revision would be lost.
        self._removed: dict[tuple[str, str], int] = {}
        self.counts = MirrorCounts()

    def get(self, adapter: str) -> Entry:
        return self._known.get(adapter, MISSING)

    def replace(self, adapter: str, desired: DesiredAdapter | None) -> None:
        """What the registry just said about ``adapter``: it wins over everything."""
        self._known[adapter] = desired
        for key in [k for k in self._removed if k[0] == adapter]:
            del self._removed[key]

    def drop(self, adapter: str) -> None:
        """Forget ``adapter``: its next reconcile reads the registry."""
        self._known.pop(adapter, None)

    def placed(self) -> set[str]:
        """Adapters with a placement setting: what a fleet change may move."""
        return {name for name, desired in self._known.items()
                if desired is not None and desired.replicas is not None}

    def apply(self, event: Event) -> bool:
        """Take in an event about one adapter; True if the adapter needs a reconcile
        (from the mirror, or from a read if the entry was dropped)."""
        if isinstance(event, VersionPublished):
            # A new version moves no alias; the alias move it comes with is its own event.
            self.counts.ignored += 1
            return False
        if isinstance(event, AdapterUpdated):
            return self._move(event)
        self._drop_counted(event.adapter)
        return True

    def _move(self, event: AdapterUpdated) -> bool:
        current = self._known.get(event.adapter, MISSING)
        if not isinstance(current, DesiredAdapter) or current.tenant != event.tenant:
            self._drop_counted(event.adapter)
            return True
        held = self._revision(current, event.alias)
        if held is not None and event.revision <= held:
            self.counts.ignored += 1  # a duplicate or a late arrival
            return False
        if held is None or event.revision != held + 1:
            # A gap: some move was not seen here. An alias the mirror holds no revision
            # for counts as one too: it may have been removed at any revision, and a
            # late first move must not bring it back.
            self._drop_counted(event.adapter)
            return True
        aliases = [a for a in current.aliases if a.alias != event.alias]
        key = (event.adapter, event.alias)
        if event.target is None:
            self._removed[key] = event.revision
        else:
            self._removed.pop(key, None)
            aliases.append(DesiredAlias(alias=event.alias, revision=event.revision,
                                        target=event.target, canary=event.canary))
        self._known[event.adapter] = current.model_copy(
            update={"aliases": sorted(aliases, key=lambda a: a.alias)})
        self.counts.applied += 1
        return True

    def _revision(self, current: DesiredAdapter, alias: str) -> int | None:
        """The revision the mirror holds for ``alias``; None if unknown."""
        for desired in current.aliases:
            if desired.alias == alias:
                return desired.revision
        return self._removed.get((current.name, alias))

    def _drop_counted(self, adapter: str) -> None:
        self.counts.dropped += 1
        self.drop(adapter)
