"""The short version of ``bench/large_adapter.py``: two pushes of the tiny model's
rank-64 LoRA on a testbed of its own. It checks that the benchmark still works and
measures what it says (every push is split into all its phases; the floor's parts were
measured), not how fast anything is: the numbers are the benchmark's to record.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import large_adapter
from bench.agent_setup import bench_testbed
from bench.large_model import SMALL
from devharness.testbed import Testbed

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    work = tmp_path_factory.mktemp("large")
    with bench_testbed(work, max_loras=4, max_loaded=3, max_lora_rank=64) as running:
        yield running


def test_the_large_adapter_benchmark_splits_every_push(testbed: Testbed,
                                                       tmp_path: Path) -> None:
    samples = asyncio.run(large_adapter.measure(testbed, tmp_path, SMALL, 2, 0))
    assert [s.version for s in samples] == [2, 3]
    for sample in samples:
        phases = sample.phases()
        assert phases is not None, sample  # every mark was found in the agent's log
        assert set(phases) == set(large_adapter.PHASES)
        # The phases cover the whole push, by construction of one timeline.
        assert math.isclose(sum(phases.values()), sample.total_s, abs_tol=1e-6)
        assert sample.s3_get_s > 0 and sample.s3_put_s > 0 and sample.vllm_load_s > 0
        assert sample.s3_get_to_disk_s > 0
        assert sample.size_bytes > 0
    summary = large_adapter.summarize(samples)
    assert summary["split"] == 2 and summary["samples"] == 2
    ratios = summary["ratio_p50"]
    assert len(ratios) == 4 and all(math.isfinite(v) for v in ratios.values()), summary
    # The totals start when the push is sent, so they are positive (the floor is too,
    # above). The other two start when the bench has read the push's answer, which a
    # loaded machine may deliver after the agent already served the new version: their
    # sign is the machine's, and a tiny one rounds to 0.0.
    assert all(s.total_s > 0 and s.floor_s > 0 for s in samples)
    assert ratios["total / floor"] > 0 and ratios["total / (floor + S3 put)"] > 0, summary
