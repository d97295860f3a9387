"""The short version of ``bench/agent_publish_to_served.py``, on the end-to-end testbed.

It checks that the benchmark still works (every mark found, the parts adding up to the
total, in timeline order), not how fast anything is: CI machines are loaded, and the
numbers are the benchmark's to record (docs/benchmarks.md).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from bench.agent_publish_to_served import parse_args, render, run_on
from bench.publish_timeline import PARTS, Push
from devharness.testbed import Testbed
from registry_service.metrics import UPLOAD_PHASES
from tests.e2e.steps import delete_adapter

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

# Agent log lines carry whole milliseconds, cut down: a mark may read up to 1 ms early.
LOG_SLACK_S = 0.0011


def test_the_publish_to_served_benchmark_splits_every_push(testbed: Testbed, unique: str,
                                                           tmp_path: Path) -> None:
    adapter = f"p2s-{unique}"
    args = parse_args(["--pushes", "3", "--warmup", "1", "--probers", "1"])
    try:
        document = run_on(testbed, args, tmp_path, adapter)
    finally:
        delete_adapter(testbed, adapter)
    summary = document["summary"]
    assert summary["pushes"] == 3 and summary["split"] == 3, summary
    assert summary["versions_with_unexpected_stage_counts"] == []
    assert summary["probe_failure_count"] == 0, summary["probe_failures"]
    # The push's upload was timed by the registry itself; a small push makes no check
    # of the adapter first (loraplane/client/multipart.py: check_first). Every file fetched.
    served = summary["registry_mean_ms"]
    assert served["POST /v1/adapters/{name}/versions"] > 0, served
    assert served["GET /v1/adapters/{name}"] is None, served
    assert sum(summary["file_fetches"].values()) >= 2 * 3, summary["file_fetches"]
    for raw in document["pushes"]:
        push = Push(**raw)
        parts = push.parts()
        assert parts is not None and list(parts) == list(PARTS)
        assert math.isclose(sum(parts.values()), push.total_s, abs_tol=1e-6), parts
        assert push.written is not None and push.received is not None
        assert push.materialized is not None and push.flipped is not None
        # The marks come in timeline order, each from its own clock reading.
        marks = [push.sent, push.written, push.received, push.materialized, push.flipped,
                 push.first_response]
        assert all(a <= b + LOG_SLACK_S for a, b in itertools.pairwise(marks)), raw
        assert min(parts[p] for p in ("fetch", "validate", "load", "flip")) > 0, parts
        assert parts["routed -> first response"] > 0, parts
        # Inside the request: the registry's phases fit in it, and the registry ran.
        phases, sched = push.registry_phases, push.sched
        assert phases is not None and list(phases) == list(UPLOAD_PHASES), raw
        assert 0 < sum(phases.values()) <= (push.answered - push.sent) * 1000 + 1, raw
        assert sched is not None and sched["registry"]["cpu_ms"] > 0, raw
        assert all(v["run_queue_ms"] >= 0 for v in sched.values()), raw
    table = render(summary)
    assert all(part in table for part in PARTS)
    assert "(registry's store phase)" in table and len(summary["slowest_requests"]) == 3
    assert len(document["commit"]) == 40 and document["database"] == "postgres"
