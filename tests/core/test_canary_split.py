"""The sticky split: the share follows the weight, a key keeps its version while the
weight holds and only moves to the canary as it grows, canaries are independent, and
the buckets are the same on every agent and release."""

from __future__ import annotations

import math
import subprocess
import sys

from loraplane.canary_split import BUCKETS, bucket, takes_canary

KEYS = [f"customer-{i}" for i in range(20_000)]
GOLDEN = [6899, 7763, 1391]  # bucket(k, 42) for "alice", "bob", ""


def _inside(count: int, n: int, share: float) -> bool:
    """Within 4.4 standard deviations of a binomial's mean (about 1 in 100,000 outside)."""
    sd = math.sqrt(n * share * (1 - share))
    return abs(count - n * share) <= 4.4 * sd


def test_the_share_follows_the_weight() -> None:
    for weight in (1, 10, 25, 50, 90):
        taken = sum(takes_canary(key, 7, weight) for key in KEYS)
        assert _inside(taken, len(KEYS), weight / 100), (weight, taken)


def test_a_key_only_ever_moves_from_stable_to_canary() -> None:
    steps = [5, 10, 25, 50, 75, 99]
    for key in KEYS[:2000]:
        seen = [takes_canary(key, 3, w) for w in steps]
        assert seen == sorted(seen), (key, seen)  # False... then True...
        assert seen == [takes_canary(key, 3, w) for w in steps]  # sticky


def test_two_canaries_split_the_keys_independently() -> None:
    both = sum(takes_canary(k, 1, 50) and takes_canary(k, 2, 50) for k in KEYS)
    assert _inside(both, len(KEYS), 0.25), both


def test_no_key_is_drawn_at_random_and_the_ends_are_exact() -> None:
    assert not any(takes_canary(k, 1, 0) for k in KEYS[:100])
    assert all(takes_canary(k, 1, 100) for k in KEYS[:100])
    drawn = sum(takes_canary(None, 1, 30) for _ in range(20_000))
    assert _inside(drawn, 20_000, 0.30), drawn


def test_the_buckets_are_the_same_in_another_process_and_release() -> None:
    # Pinned: agents of two releases serving one canary must agree on every key.
    assert [bucket(k, 42) for k in ("alice", "bob", "")] == GOLDEN
    script = ("from loraplane.canary_split import bucket;"
              "print([bucket(k, 42) for k in ('alice', 'bob', '')])")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123"}).stdout
    assert out.strip() == str(GOLDEN)
    assert all(0 <= b < BUCKETS for b in GOLDEN)
