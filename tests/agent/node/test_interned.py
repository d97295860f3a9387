"""The status report's shared entries (inference_agent/node/interned.py)."""

from __future__ import annotations

import pytest

from inference_agent.node import interned
from loraplane.events import ServedVersion, TierEntry


def test_equal_entries_are_one_instance_and_different_ones_are_not() -> None:
    served = interned.served_version("bot", "live", 3, "serving")
    assert served is interned.served_version("bot", "live", 3, "serving")
    assert served == ServedVersion(adapter="bot", alias="live", version=3, state="serving")
    assert served is not interned.served_version("bot", "live", 3, "loading")
    assert served is not interned.served_version("bot", None, 3, "serving")
    tier = interned.tier_entry("bot", 3, "hot", True, False)
    assert tier is interned.tier_entry("bot", 3, "hot", True, False)
    assert tier == TierEntry(adapter="bot", version=3, tier="hot", owned=True)
    assert tier is not interned.tier_entry("bot", 3, "hot", True, True)


def test_the_tables_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interned, "MAX_INTERNED", 3)
    first = interned.tier_entry("bound-0", 1, "warm", False, False)
    for n in range(1, 10):
        interned.tier_entry(f"bound-{n}", 1, "warm", False, False)
        interned.served_version(f"bound-{n}", "live", 1, "serving")
        assert len(interned._tiers) <= 3 and len(interned._served) <= 3
    again = interned.tier_entry("bound-0", 1, "warm", False, False)
    assert again == first and again is not first  # emptied since, and made anew
