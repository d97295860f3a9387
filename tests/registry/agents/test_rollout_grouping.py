"""The pure rollout logic: grouping entries by alias and judging convergence."""

from __future__ import annotations

from datetime import UTC, datetime

from loraplane.events import AgentStatus, ServedVersion
from registry_service.agents.rollout import (
    AgentReport,
    AliasTarget,
    adapter_entries,
    alias_rollout,
    group_entries,
)
from tests.registry.agents.support import served


def agent(agent_id: str, *entries: ServedVersion, failures: tuple[ServedVersion, ...] = (),
          stale: bool = False, base_model: str = "m") -> AgentReport:
    status = AgentStatus(agent_id=agent_id, base_model=base_model, time=datetime.now(UTC),
                         served=list(entries), failures=list(failures))
    return AgentReport(agent_id=agent_id, base_model=base_model, stale=stale, status=status)


def test_entries_are_for_the_adapter_only_and_listed_once() -> None:
    failure = served("bot", 2, "canary", "failed", reason="nan", code="nan")
    reports = [agent("a", served("bot", 1), served("other", 1), failure, failures=(failure,)),
               agent("b", failures=(served("bot", 3, None, "loading", reason="disk full"),))]
    entries = adapter_entries(reports, "bot")
    assert [(e.agent_id, e.version, e.state, e.reason) for e in entries] == [
        ("a", 1, "serving", None), ("a", 2, "failed", "nan"),
        # Anything in the failures list is a failure, whatever state it names.
        ("b", 3, "failed", "disk full")]


def test_an_entry_without_alias_counts_for_every_alias_at_its_version() -> None:
    targets = [AliasTarget("canary", 3, 1), AliasTarget("live", 3, 4),
               AliasTarget("old", None, 2)]
    reports = [agent("a", served("bot", 3, None), served("bot", 2, None),
                     served("bot", 1, "gone"), served("bot", 3, "live"))]
    by_alias, unaliased = group_entries(adapter_entries(reports, "bot"), targets)
    assert [(e.alias, e.version) for e in by_alias["canary"]] == [(None, 3)]
    assert [(e.alias, e.version) for e in by_alias["live"]] == [(None, 3), ("live", 3)]
    assert by_alias["old"] == []
    assert [(e.alias, e.version) for e in unaliased] == [(None, 2), ("gone", 1)]


def test_convergence_counts_fresh_agents_of_the_base_model() -> None:
    target = AliasTarget("live", 5, 2)
    fleet = [agent("done", served("bot", 5)),
             agent("loading", served("bot", 5, state="loading")),
             agent("behind", served("bot", 4)),
             agent("stale", served("bot", 4), stale=True)]
    reports = [*fleet, agent("alien", base_model="x",
                             failures=(served("bot", 5, state="failed", reason="wrong base"),))]
    entries, _ = group_entries(adapter_entries(reports, "bot"), [target])
    result = alias_rollout(target, entries["live"], fleet)
    assert (result.pending, result.converged) == (["loading", "behind"], False)
    assert [e.agent_id for e in result.failed] == ["alien"]
    caught_up = [agent("done", served("bot", 5)), agent("stale", served("bot", 4), stale=True)]
    entries, _ = group_entries(adapter_entries(caught_up, "bot"), [target])
    assert alias_rollout(target, entries["live"], caught_up).converged is True
    broken = [*caught_up, agent("bad", failures=(served("bot", 5, state="failed"),))]
    entries, _ = group_entries(adapter_entries(broken, "bot"), [target])
    result = alias_rollout(target, entries["live"], broken)
    assert (result.pending, result.converged) == ([], False)


def test_a_removed_alias_converges_when_no_fresh_agent_reports_it() -> None:
    target = AliasTarget("canary", None, 3)
    still = [agent("a", served("bot", 2, "canary", "draining"))]
    entries, _ = group_entries(adapter_entries(still, "bot"), [target])
    result = alias_rollout(target, entries["canary"], still)
    assert (result.pending, result.converged) == ([], False)
    gone = [agent("a", served("bot", 2, "canary", "draining"), stale=True)]
    entries, _ = group_entries(adapter_entries(gone, "bot"), [target])
    assert alias_rollout(target, entries["canary"], gone).converged is True


def test_no_agents_is_not_converged_and_says_why() -> None:
    target = AliasTarget("live", 5, 2)
    result = alias_rollout(target, [], [])
    assert (result.converged, result.reason) == (False, "no agents")
    only_stale = [agent("old", served("bot", 5), stale=True)]
    entries, _ = group_entries(adapter_entries(only_stale, "bot"), [target])
    result = alias_rollout(target, entries["live"], only_stale)
    assert (result.converged, result.reason) == (False, "no agents")
    # A removed alias that nobody reports has nothing left to do, agents or not.
    assert alias_rollout(AliasTarget("old", None, 3), [], []).converged is True
    waiting = [agent("behind", served("bot", 4))]
    entries, _ = group_entries(adapter_entries(waiting, "bot"), [target])
    result = alias_rollout(target, entries["live"], waiting)
    assert (result.converged, result.reason) == (False, "1 agent(s) pending")
    done = [agent("done", served("bot", 5))]
    entries, _ = group_entries(adapter_entries(done, "bot"), [target])
    result = alias_rollout(target, entries["live"], done)
    assert (result.converged, result.reason) == (True, None)
