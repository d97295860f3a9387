"""Grouping agent reports into the rollout of one adapter, alias by alias (pure logic)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from loraplane.events import AgentStatus, TierEntry
from loraplane.naming import parse_model_ref
from loraplane.placement import owners
from registry_service.agents.schemas import AliasRollout, RolloutEntry, TierOut


@dataclass(frozen=True, slots=True)
class AgentReport:
    agent_id: str
    base_model: str
    stale: bool
    status: AgentStatus


@dataclass(frozen=True, slots=True)
class AliasTarget:
    alias: str
    version: int | None
    revision: int


@dataclass
class ReportIndex:
    """The reports' entries and tiers by adapter, gathered in one pass over them: a
    fleet view of every adapter then costs the reports once, not once per adapter."""

    entries: dict[str, list[RolloutEntry]]
    # (agent id, adapter) -> the tiers the agent lists, or the versions it has loaded.
    listed: dict[tuple[str, str], list[TierEntry]]
    loaded: dict[tuple[str, str], list[int]]

    def entries_of(self, adapter: str) -> list[RolloutEntry]:
        return self.entries.get(adapter, [])

    def tiers_of(self, fleet: list[AgentReport], adapter: str) -> list[TierOut]:
        """Each agent's tier of each version of ``adapter``. An agent that reports no
        tiers for it (an older agent) still shows its loaded versions as hot."""
        out: list[TierOut] = []
        for report in fleet:
            listed = self.listed.get((report.agent_id, adapter), [])
            if not listed:
                out += [TierOut(agent_id=report.agent_id, version=v, tier="hot", owned=False,
                                stale=report.stale)
                        for v in self.loaded.get((report.agent_id, adapter), [])]
            out += [TierOut(agent_id=report.agent_id, version=t.version, tier=t.tier,
                            owned=t.owned, over_capacity=t.over_capacity, stale=report.stale)
                    for t in listed]
        return out


def index_reports(reports: list[AgentReport]) -> ReportIndex:
    index = ReportIndex({}, {}, {})
    seen: set[tuple[str, str, str | None, int, str]] = set()
    for report in reports:
        for entry in _entries(report):
            key = (entry[0], report.agent_id, entry[1].alias, entry[1].version, entry[1].state)
            if key not in seen:  # each (agent, alias, version, state) once per adapter
                seen.add(key)
                index.entries.setdefault(entry[0], []).append(entry[1])
        for tier in report.status.tiers:
            index.listed.setdefault((report.agent_id, tier.adapter), []).append(tier)
        for name in report.status.loaded:
            ref = parse_model_ref(name)
            if ref is not None and ref.version is not None:
                index.loaded.setdefault((report.agent_id, ref.adapter), []).append(ref.version)
    return index


def adapter_entries(reports: list[AgentReport], adapter: str) -> list[RolloutEntry]:
    """Every entry about ``adapter``, each (agent, alias, version, state) once."""
    return index_reports(reports).entries_of(adapter)


def _entries(report: AgentReport) -> Iterator[tuple[str, RolloutEntry]]:
    for served in report.status.served:
        yield served.adapter, RolloutEntry(
            agent_id=report.agent_id, alias=served.alias, version=served.version,
            state=served.state, reason=served.reason, code=served.code, stale=report.stale)
    for failure in report.status.failures:
        # Whatever state the agent gave it, a listed failure is a failure.
        yield failure.adapter, RolloutEntry(
            agent_id=report.agent_id, alias=failure.alias, version=failure.version,
            state="failed", reason=failure.reason, code=failure.code, stale=report.stale)


def _aliases_of(entry: RolloutEntry, targets: list[AliasTarget]) -> list[str]:
    names = {t.alias for t in targets}
    if entry.alias is not None:
        return [entry.alias] if entry.alias in names else []
    # An entry without an alias counts for every alias that points at its version.
    return [t.alias for t in targets if t.version is not None and t.version == entry.version]


def group_entries(
    entries: list[RolloutEntry], targets: list[AliasTarget]
) -> tuple[dict[str, list[RolloutEntry]], list[RolloutEntry]]:
    """Entries by alias name, and those tied to no alias the adapter has."""
    by_alias: dict[str, list[RolloutEntry]] = {t.alias: [] for t in targets}
    unaliased: list[RolloutEntry] = []
    for entry in entries:
        names = _aliases_of(entry, targets)
        for name in names:
            by_alias[name].append(entry)
        if not names:
            unaliased.append(entry)
    return by_alias, unaliased


def alias_rollout(
    target: AliasTarget, entries: list[RolloutEntry], fleet: list[AgentReport]
) -> AliasRollout:
    """How far ``target`` got across ``fleet`` (the agents of the adapter's base model)."""
    serving = [e for e in entries if e.state != "failed"]
    failed = [e for e in entries if e.state == "failed"]
    pending: list[str] = []
    if target.version is None:
        # A removed alias has converged once no fresh agent still reports it.
        still = sum(1 for e in serving if not e.stale)
        reason = f"{still} agent(s) still serve it" if still else None
    else:
        # Only fresh agents of the base model count; others' failures are shown, not owed.
        fresh = {r.agent_id for r in fleet if not r.stale}
        done = {e.agent_id for e in serving
                if e.version == target.version and e.state == "serving"}
        broken = {e.agent_id for e in failed if e.version == target.version} & fresh
        pending = [r.agent_id for r in fleet
                   if r.agent_id in fresh and r.agent_id not in done | broken]
        reason = _not_converged(fresh, pending, broken)
    return AliasRollout(alias=target.alias, version=target.version, revision=target.revision,
                        serving=serving, failed=failed, pending=pending,
                        converged=reason is None, reason=reason)


def _not_converged(fresh: set[str], pending: list[str], broken: set[str]) -> str | None:
    # Nobody serving the target is not a rollout that finished.
    if not fresh:
        return "no agents"
    if broken:
        return f"{len(broken)} agent(s) failed"
    return f"{len(pending)} agent(s) pending" if pending else None


def tier_entries(reports: list[AgentReport], adapter: str) -> list[TierOut]:
    """Each agent's tier of each version of ``adapter`` (``ReportIndex.tiers_of``)."""
    return index_reports(reports).tiers_of(reports, adapter)


def placement(adapter: str, replicas: int | None, fleet: list[AgentReport],
              tiers: list[TierOut]) -> tuple[list[str], list[str]]:
    """(the fresh agents that own ``adapter``, the fresh agents where it is hot)."""
    fresh = [r.agent_id for r in fleet if not r.stale]
    placed = owners(fresh, adapter, replicas) if replicas is not None else []
    hot = sorted({t.agent_id for t in tiers if t.tier == "hot" and not t.stale})
    return placed, hot
