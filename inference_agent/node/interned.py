"""The status report's entries, made once and shared by every report that lists them.

An agent of a fleet lists every alias it routes and every version's tier: a couple of
hundred entries at a hundred adapters, of which a push changes two or three, so each
entry is made (and validated) once, not once per report. The entries are frozen models,
so one instance may sit in any number of reports; two reports that list the same entries
also compare equal by identity, which is what ``StatusReporter`` checks before it posts.
Why: docs/decisions.md#status-report-entries-are-made-once

The tables are bounded: when one is full it is emptied and fills again with what the
next reports list.
"""

from __future__ import annotations

from typing import TypeVar

from loraplane.events import ServedVersion, ServeState, Tier, TierEntry

MAX_INTERNED = 8192

K = TypeVar("K")
V = TypeVar("V")
_tiers: dict[tuple[str, int, Tier, bool, bool], TierEntry] = {}
_served: dict[tuple[str, str | None, int, ServeState], ServedVersion] = {}


def _keep(table: dict[K, V], key: K, entry: V) -> V:
    if len(table) >= MAX_INTERNED:
        table.clear()
    table[key] = entry
    return entry


def tier_entry(adapter: str, version: int, tier: Tier, owned: bool,
               over_capacity: bool) -> TierEntry:
    key = (adapter, version, tier, owned, over_capacity)
    return _tiers.get(key) or _keep(_tiers, key, TierEntry(
        adapter=adapter, version=version, tier=tier, owned=owned,
        over_capacity=over_capacity))


def served_version(adapter: str, alias: str | None, version: int,
                   state: ServeState) -> ServedVersion:
    """An entry with no reason or code (a failure's has its own text: never shared)."""
    key = (adapter, alias, version, state)
    return _served.get(key) or _keep(_served, key, ServedVersion(
        adapter=adapter, alias=alias, version=version, state=state))
