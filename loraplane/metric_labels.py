"""Bounding how many adapter names become metric label values.

Every distinct label value is a time series per metric in Prometheus, and a fleet can hold
thousands of adapters. ``AdapterLabels`` lets the first ``limit`` distinct names a process
sees through as themselves and folds every later one into ``OTHER``, so one process
exports at most ``limit + 1`` adapter values per metric, whatever the fleet holds.
First come, first kept: a name once given its own value keeps it for the process's life,
so its series never jumps between its name and ``OTHER``.
"""

from __future__ import annotations

# Not a slug (adapter names are), so it cannot collide with a real adapter's name.
OTHER = "_other"
DEFAULT_MAX_ADAPTER_LABELS = 200


class AdapterLabels:
    """Maps adapter names to bounded label values (see the module's docstring)."""

    def __init__(self, limit: int = DEFAULT_MAX_ADAPTER_LABELS) -> None:
        if limit < 0:
            raise ValueError("the label limit cannot be negative")
        self.limit = limit
        self._kept: set[str] = set()

    def __call__(self, adapter: str) -> str:
        if adapter in self._kept:
            return adapter
        if len(self._kept) < self.limit:
            self._kept.add(adapter)
            return adapter
        return OTHER
