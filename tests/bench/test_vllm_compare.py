"""The short versions of ``bench/vllm_resolver.py`` and ``bench/large_adapter.py``.

Both run on one testbed of their own (the tiny model; its vLLM has the filesystem
resolver on and ``--max-lora-rank 64``), two samples each. They check that the
benchmarks still work and measure what they say (the resolver really serves a folder
it was never told about; every push is split into all its phases; the floor's parts
were measured), not how fast anything is: the numbers are the benchmarks' to record.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import large_adapter, vllm_resolver
from bench.agent_setup import bench_testbed
from bench.large_model import SMALL
from devharness.testbed import Testbed

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


@pytest.fixture(scope="module")
def resolver_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("resolver")


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory, resolver_dir: Path
            ) -> Iterator[Testbed]:
    work = tmp_path_factory.mktemp("compare")
    with bench_testbed(work, max_loras=4, max_loaded=3, max_lora_rank=64,
                       vllm_env=vllm_resolver.resolver_env(resolver_dir)) as running:
        yield running


def test_the_resolver_benchmark_compares_both_sides(testbed: Testbed, resolver_dir: Path,
                                                    tmp_path: Path) -> None:
    samples = asyncio.run(vllm_resolver.run(testbed, tmp_path, resolver_dir, 2, 0))
    summary = vllm_resolver.summarize(samples)
    for kind, row in summary["kinds"].items():
        assert row["n"] == 2, (kind, row)
        assert row["loraplane_p50_ms"] > 0 and row["resolver_p50_ms"] > 0, row
        assert math.isfinite(row["ratio_p50"]) and row["ratio_p50"] > 0, row
    # Resolver names were never loaded through the API: vLLM found them by itself.
    assert sorted(p.name for p in resolver_dir.iterdir()) == sorted(
        [f"res-{i}" for i in range(2)] + [f"rcold-{i}" for i in range(2)])
    assert {n for n in testbed.vllms["a"].loaded_adapters() if n.startswith("r")} >= {
        "res-0", "res-1", "rcold-0", "rcold-1"}
    assert summary["probe_requests"] >= 2
    assert len(summary["parts"]) == 4 and all(p["n"] == 2 for p in summary["parts"].values())
    assert "ratio p50" in vllm_resolver.render(summary)


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
