"""The picker's scoring on pages written by hand: affinity first, then spare capacity,
then waiting; the queue and KV terms only break what affinity leaves equal; ties are
broken at random. (tests/e2e/test_routing.py runs it against real agents.)"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from devharness.llmd import EndpointMetrics
from devharness.llmd_picker import (
    LlmdPolicy,
    RandomPolicy,
    Weights,
    free_slots,
    queue_scores,
    request_stream,
    scores,
)


def endpoint(running: set[str], max_lora: int, *, waiting: set[str] | None = None,
             queue: float = 0.0, kv: float = 0.0) -> EndpointMetrics:
    return EndpointMetrics(active_models=running, waiting_models=waiting or set(),
                           max_active_models=max_lora, waiting_queue=queue,
                           kv_cache_usage=kv)


def test_a_hot_agent_beats_one_with_a_free_slot_and_that_beats_a_full_one() -> None:
    hot = endpoint({"bot", "bot@1", "x", "x@2"}, 4)
    spare = endpoint({"y", "y@1"}, 4)
    full = endpoint({"y", "y@1", "z", "z@1"}, 4)
    waiting = endpoint({"z", "z@1"}, 2, waiting={"bot"})
    assert free_slots(spare) == 2 and free_slots(full) == 0 and free_slots(hot) == 0
    # Affinity 1.0 / 0.8 / 0 / 0.6, times 3, plus the queue (all equal: 1) and KV terms.
    assert scores([hot, spare, full, waiting], "bot") == pytest.approx([5.0, 4.4, 2.0, 3.8])
    assert LlmdPolicy(random.Random(0)).choose([full, spare, hot], "bot") == 2


def test_queue_and_kv_decide_only_between_equal_affinities() -> None:
    idle = endpoint({"bot"}, 1, queue=0, kv=0.1)
    busy = endpoint({"bot"}, 1, queue=4, kv=0.5)
    assert queue_scores([idle, busy]) == [1.0, 0.0]
    assert LlmdPolicy(random.Random(0)).choose([busy, idle], "bot") == 1
    cold_idle = endpoint(set(), 0, queue=0)
    # A hot agent with a queue still wins over an idle one without the adapter.
    assert LlmdPolicy(random.Random(0)).choose([cold_idle, busy], "bot") == 1
    only_affinity = LlmdPolicy(random.Random(0), Weights(queue=0, kv_cache=0))
    assert scores([idle, busy], "bot", only_affinity.weights) == [3.0, 3.0]


def test_ties_are_broken_at_random_and_the_random_policy_ignores_the_page() -> None:
    same = [endpoint(set(), 0), endpoint(set(), 0)]
    picker = LlmdPolicy(random.Random(5))
    picks = Counter(picker.choose(same, "bot") for _ in range(200))
    assert set(picks) == {0, 1}
    hot_first = [endpoint({"bot"}, 1), endpoint(set(), 0)]
    anywhere = RandomPolicy(random.Random(5))
    picks = Counter(anywhere.choose(hot_first, "bot") for _ in range(200))
    assert set(picks) == {0, 1}


def test_a_zipf_stream_favours_the_first_items() -> None:
    uniform = Counter(request_stream("abcd", 4000, random.Random(1)))
    skewed = Counter(request_stream("abcd", 4000, random.Random(1), zipf_s=1.0))
    assert set(uniform) == set(skewed) == set("abcd")
    assert skewed["a"] > 2 * skewed["d"]
    assert max(uniform.values()) < 1.25 * min(uniform.values())
