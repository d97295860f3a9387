"""Rendezvous placement: stable, balanced, and minimal moves when the fleet changes."""

from __future__ import annotations

from collections import Counter

import pytest

from loraplane.placement import assignment, owners, owns, weight

AGENTS = [f"agent-{i}" for i in range(8)]
ADAPTERS = {f"adapter-{i}": 1 for i in range(400)}


def test_weights_and_owners_are_stable_across_calls_and_input_order() -> None:
    # Known value: blake2b is not salted per process, so every agent computes the same.
    assert weight("agent-0", "adapter-0") == weight("agent-0", "adapter-0")
    assert weight("a", "bc") != weight("ab", "c")
    first = owners(AGENTS, "adapter-7", 3)
    assert owners(list(reversed(AGENTS)), "adapter-7", 3) == first
    assert owners(AGENTS + AGENTS, "adapter-7", 3) == first
    assert len(first) == 3 and len(set(first)) == 3


def test_no_replicas_setting_means_every_agent_owns_it() -> None:
    assert owners(AGENTS, "adapter-1", None) == sorted(AGENTS)
    assert owns("agent-3", AGENTS, "adapter-1", None)


@pytest.mark.parametrize("replicas", [0, 1, 2, 8, 20])
def test_replicas_are_capped_by_the_fleet(replicas: int) -> None:
    assert len(owners(AGENTS, "adapter-1", replicas)) == min(replicas, len(AGENTS))


def test_an_agent_not_listed_yet_still_computes_its_share() -> None:
    # A new agent that has not reported yet: it counts itself in.
    expected = "agent-new" in owners([*AGENTS, "agent-new"], "adapter-5", 2)
    assert owns("agent-new", AGENTS, "adapter-5", 2) == expected


@pytest.mark.parametrize("replicas", [1, 2])
def test_load_is_balanced(replicas: int) -> None:
    placed = assignment(AGENTS, dict.fromkeys(ADAPTERS, replicas))
    load = Counter(agent for holders in placed.values() for agent in holders)
    mean = len(ADAPTERS) * replicas / len(AGENTS)
    # 400 adapters over 8 agents: each holds within 35% of the mean (binomial spread).
    assert set(load) == set(AGENTS)
    assert all(abs(n - mean) <= 0.35 * mean for n in load.values()), load


def _moves(before: dict[str, set[str]], after: dict[str, set[str]]) -> tuple[int, int]:
    """(loads, unloads): owners gained and owners lost, over every adapter."""
    loads = sum(len(after[a] - before[a]) for a in before)
    unloads = sum(len(before[a] - after[a]) for a in before)
    return loads, unloads


@pytest.mark.parametrize("replicas", [1, 2])
def test_joining_moves_only_what_the_new_agent_takes(replicas: int) -> None:
    wanted = dict.fromkeys(ADAPTERS, replicas)
    before = assignment(AGENTS, wanted)
    after = assignment([*AGENTS, "agent-new"], wanted)
    changed = [a for a in ADAPTERS if before[a] != after[a]]
    for name in changed:
        # Each change is the newcomer taking one owner's place, nothing else.
        assert after[name] - before[name] == {"agent-new"}
        assert len(before[name] - after[name]) == 1
    loads, unloads = _moves(before, after)
    taken = sum(1 for holders in after.values() if "agent-new" in holders)
    assert loads == unloads == taken == len(changed)
    # The minimum for a balanced fleet of 9 is the newcomer's fair share.
    minimum = len(ADAPTERS) * replicas / (len(AGENTS) + 1)
    assert abs(loads - minimum) <= 0.35 * minimum, (loads, minimum)


@pytest.mark.parametrize("replicas", [1, 2])
def test_leaving_moves_only_what_the_leaver_owned(replicas: int) -> None:
    wanted = dict.fromkeys(ADAPTERS, replicas)
    before = assignment(AGENTS, wanted)
    after = assignment([a for a in AGENTS if a != "agent-3"], wanted)
    owned = {a for a in ADAPTERS if "agent-3" in before[a]}
    changed = {a for a in ADAPTERS if before[a] != after[a]}
    # Exactly the leaver's adapters move: the minimum, each to one new owner.
    assert changed == owned
    for name in changed:
        assert before[name] - after[name] == {"agent-3"}
        assert len(after[name] - before[name]) == 1
    assert _moves(before, after) == (len(owned), len(owned))


def test_ten_out_ten_in_stays_near_the_minimum() -> None:
    fleet = [f"agent-{i}" for i in range(100)]
    adapters = {f"adapter-{i}": 2 for i in range(1000)}
    before = assignment(fleet, adapters)
    after = assignment([*fleet[10:], *(f"fresh-{i}" for i in range(10))], adapters)
    loads, unloads = _moves(before, after)
    # The leavers' share must move; the newcomers take a share of the same size.
    leavers = sum(len(h & set(fleet[:10])) for h in before.values())
    assert loads == unloads
    assert loads <= leavers * 2
    assert loads >= leavers
