"""The bound on adapter label values (loraplane/metric_labels.py)."""

from __future__ import annotations

import pytest

from loraplane.metric_labels import OTHER, AdapterLabels


def test_the_first_names_keep_their_value_and_later_ones_fold() -> None:
    labels = AdapterLabels(limit=2)
    assert [labels(n) for n in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER, "a",
                                                                    OTHER, "b"]


def test_a_limit_of_zero_folds_everything_and_a_negative_one_is_refused() -> None:
    assert AdapterLabels(limit=0)("a") == OTHER
    with pytest.raises(ValueError, match="negative"):
        AdapterLabels(limit=-1)
