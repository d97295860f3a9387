"""The short version of ``bench/zipf_adapters.py`` on the shared vLLM: both systems serve
the whole stream, and the agent's counters add up; how fast is the bench's to say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.zipf_adapters import main
from devharness.vllm import VllmServer
from tests.vllm_fixtures import SHARED_MAX_LORAS

pytestmark = pytest.mark.vllm


def test_the_zipf_benchmark_serves_every_request_of_both_systems(
        tmp_path: Path, tiny_model: Path, vllm_server: VllmServer) -> None:
    out = tmp_path / "result.json"
    requests = 30
    result = main(["--vllm-url", vllm_server.url, "--model-dir", str(tiny_model),
                   "--adapters", "8", "--slots", str(SHARED_MAX_LORAS), "--requests",
                   str(requests), "--rounds", "1", "--concurrency", "2", "--max-tokens", "2",
                   "--json-out", str(out)])
    assert json.loads(out.read_text()) == result
    for system in ("vllm", "agent"):
        ttft = result[system]["ttft"]
        assert ttft["failures"] == 0, ttft["failed"]
        assert ttft["all"]["n"] == ttft["hits"]["n"] + ttft["misses"]["n"] == requests
    agent = result["agent"]["agent"]
    # Every request either found its version loaded or waited on a load.
    assert agent["hits"] + agent["waited_on_load"] == requests
    distinct = result["distinct_adapters_in_stream"]
    assert distinct <= agent["loads"] <= agent["waited_on_load"]
    assert agent["evictions"] >= distinct - SHARED_MAX_LORAS
    assert set(result["ratio_agent_to_vllm"]) >= {"ttft_all_p50", "requests_per_s"}
    assert vllm_server.loaded_adapters() == [], "the bench leaves vLLM as it found it"
