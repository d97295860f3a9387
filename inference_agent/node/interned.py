"""The status report's entries, made once and shared by every report that lists them.

An agent of a fleet lists every alias it routes and every version's tier: a couple of
hundred entries at a hundred adapters, of which a push changes two or three. Building
the report, each entry made again as a validated pydantic model, was about a sixth of
an agent's busy samples per push (``bench/agent_push_cpu.py``, py-spy; the entries
alone about a tenth). The entries are frozen models, so one
instance may sit in any number of reports; two reports that list the same entries also
compare equal by identity, which is what ``StatusReporter`` checks before it posts.

The tables are bounded: when one is full it is emptied and fills again with what the
next reports list.
"""

from __future__ import annotations

from loraplane.events import ServedVersion, ServeState, Tier, TierEntry

MAX_INTERNED = 8192

_TierKey = tuple[str, int, Tier, bool, bool]
_ServedKey = tuple[str, str | None, int, ServeState]
_tiers: dict[_TierKey, TierEntry] = {}
_served: dict[_ServedKey, ServedVersion] = {}


def tier_entry(adapter: str, version: int, tier: Tier, owned: bool,
               over_capacity: bool) -> TierEntry:
    key = (adapter, version, tier, owned, over_capacity)
    entry = _tiers.get(key)
    if entry is None:
        if len(_tiers) >= MAX_INTERNED:
            _tiers.clear()
        entry = _tiers[key] = TierEntry(adapter=adapter, version=version, tier=tier,
                                        owned=owned, over_capacity=over_capacity)
    return entry


def served_version(adapter: str, alias: str | None, version: int,
                   state: ServeState) -> ServedVersion:
    """An entry with no reason or code (a failure's has its own text: never shared)."""
    key = (adapter, alias, version, state)
    entry = _served.get(key)
    if entry is None:
        if len(_served) >= MAX_INTERNED:
            _served.clear()
        entry = _served[key] = ServedVersion(adapter=adapter, alias=alias, version=version,
                                             state=state)
    return entry
