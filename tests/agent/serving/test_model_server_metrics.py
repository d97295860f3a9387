"""The model-server protocol series, read the way llm-d's endpoint picker reads them
(devharness/llmd.py), from the agent's route table and a stand-in of its cache; and the
copy of vLLM's series kept in memory. The agent with a real vLLM:
tests/agent/test_model_server_protocol.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry

from devharness.llmd import LORA_INFO, families, lora_affinity_score, parse_endpoint
from devharness.waiting import eventually
from inference_agent.errors import VllmUnavailable
from inference_agent.node.vllm_metrics import PASSED_FAMILIES, VllmMetricsMirror, select_families
from inference_agent.serving.model_server_metrics import ModelServerMetrics, client_names
from inference_agent.serving.routes import RouteTable
from loraplane.events import VersionRef

BASE = "tiny-llama"
# The shape of vLLM 0.32's /metrics (abridged): what passes and what does not.
VLLM_PAGE = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/models/base"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="/models/base"} 5.0
# HELP vllm:num_requests_waiting_by_reason Requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 5.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="/models/base"} 0.25
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2048"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="/models/base"} 99.0
"""


def ref(adapter: str, version: int) -> VersionRef:
    return VersionRef(adapter=adapter, version=version, digest=f"{version:064x}",
                      base_model=BASE, rank=8, alpha=16, target_modules=["q_proj"], files=[])


class Cache:
    """The adapter cache as the protocol sees it: loaded and loading names, a capacity."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.loaded: list[str] = []
        self.loading: list[str] = []

    def loaded_names(self) -> list[str]:
        return list(self.loaded)

    def loading_names(self) -> list[str]:
        return list(self.loading)


@pytest.fixture
def routes() -> RouteTable:
    table = RouteTable(BASE)
    table.set_owner("bot", "acme")
    table.set_alias("bot", "live", 1, ref("bot", 3))
    table.set_alias("bot", "canary", 1, ref("bot", 4))
    table.set_owner("sum", "acme")
    table.set_alias("sum", "live", 1, ref("sum", 1))
    return table


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_version_is_listed_under_every_name_the_front_door_takes(routes: RouteTable
                                                                   ) -> None:
    assert client_names(routes, "bot@3") == ["bot@3", "bot", "bot@live"]
    assert client_names(routes, "bot@4") == ["bot@4", "bot@canary"]
    # A version no alias points at any more (draining, or asked for as name@N).
    assert client_names(routes, "bot@2") == ["bot@2"]
    routes.set_alias("bot", "canary", 2, ref("bot", 3))
    assert client_names(routes, "bot@3") == ["bot@3", "bot@canary", "bot", "bot@live"]


def test_the_picker_reads_loaded_and_loading_versions_with_their_capacity(
        routes: RouteTable) -> None:
    cache = Cache(capacity=3)
    cache.loaded = ["bot@3"]
    cache.loading = ["bot@4"]
    clock = Clock()
    protocol = ModelServerMetrics(routes, cache, None, wall_clock=clock)
    seen = parse_endpoint(protocol.lora_info())
    assert seen.active_models == {"bot", "bot@live", "bot@3"}
    assert seen.waiting_models == {"bot@4", "bot@canary"}
    # Five names listed and one free slot of three: six, so "fewer names than max_lora"
    # holds exactly while a slot is free.
    assert seen.max_active_models == 6
    assert lora_affinity_score(seen, "bot") == 1.0
    assert lora_affinity_score(seen, "bot@3") == 1.0
    assert lora_affinity_score(seen, "sum") == 0.8
    cache.loaded = ["bot@3", "sum@1"]
    seen = parse_endpoint(protocol.lora_info())
    # Full: a waiting model scores 0.6, a cold one 0.
    assert seen.max_active_models == len(seen.active_models) + len(seen.waiting_models) == 8
    assert lora_affinity_score(seen, "bot@canary") == 0.6
    assert lora_affinity_score(seen, "other") == 0.0


def test_the_value_is_the_time_the_labels_last_changed(routes: RouteTable) -> None:
    cache = Cache(capacity=2)
    clock = Clock()
    protocol = ModelServerMetrics(routes, cache, None, wall_clock=clock)

    def series() -> tuple[dict[str, str], float]:
        (sample,) = families(protocol.lora_info())[LORA_INFO]
        return sample.labels, sample.value

    assert series() == ({"max_lora": "2", "running_lora_adapters": "",
                         "waiting_lora_adapters": ""}, clock.now)
    first = clock.now
    clock.now += 10
    assert series()[1] == first, "nothing changed: the same series, the same value"
    cache.loaded = ["sum@1"]
    labels, value = series()
    assert labels["running_lora_adapters"] == "sum@1,sum,sum@live" and value == clock.now


def test_only_the_passed_families_are_kept() -> None:
    kept = select_families(VLLM_PAGE, PASSED_FAMILIES)
    assert set(families(kept)) == {"vllm:num_requests_running", "vllm:num_requests_waiting",
                                   "vllm:kv_cache_usage_perc", "vllm:cache_config_info"}
    # HELP, TYPE and one sample per family, vLLM's labels unchanged.
    assert len(kept.splitlines()) == 12
    assert 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2048"} 1.0' in kept


async def test_the_agent_page_holds_one_lora_series_and_vllms_others(
        routes: RouteTable) -> None:
    mirror = VllmMetricsMirror(_answer(VLLM_PAGE), interval_s=1)
    assert await mirror.refresh()
    cache = Cache(capacity=4)
    cache.loaded = ["bot@4"]
    page = (await ModelServerMetrics(routes, cache, mirror).render()).decode()
    assert len(families(page)[LORA_INFO]) == 1, "vLLM's own lora series is not passed on"
    seen = parse_endpoint(page)
    assert (seen.waiting_queue, seen.running_requests, seen.kv_cache_usage) == (5, 2, 0.25)
    assert (seen.cache_block_size, seen.cache_num_blocks) == (16, 2048)
    assert seen.active_models == {"bot@4", "bot@canary"}


def _answer(text: str) -> Callable[[], Awaitable[str]]:
    async def fetch() -> str:
        return text
    return fetch


async def test_the_copy_is_taken_again_only_when_a_scrape_finds_it_old() -> None:
    calls, failing = 0, True
    clock = [0.0]
    gate = asyncio.Event()

    async def fetch() -> str:
        nonlocal calls
        calls += 1
        if failing:
            raise VllmUnavailable("not answering")
        await gate.wait()
        return VLLM_PAGE

    registry = CollectorRegistry()
    mirror = VllmMetricsMirror(fetch, interval_s=1, max_age_s=5, registry=registry,
                               clock=lambda: clock[0])
    assert registry.get_sample_value("loraplane_agent_vllm_metrics_age_seconds") == -1
    assert await mirror.current() == "" and calls == 1
    failing = False
    # Scrapes that find the copy old share one call; one that hangs up cancels nothing.
    scrapes = [asyncio.create_task(mirror.current()) for _ in range(4)]
    await eventually(lambda: calls == 2, timeout_s=10, what="the shared call to vLLM")
    scrapes[0].cancel()
    gate.set()
    kept = select_families(VLLM_PAGE, PASSED_FAMILIES)
    assert await asyncio.gather(*scrapes[1:]) == [kept] * 3 and calls == 2
    clock[0] += 1.0
    assert await mirror.current() == kept and calls == 2, "within the interval: memory"
    clock[0] += 0.5
    assert await mirror.current() == kept and calls == 3, "older: asked again first"
    scrapes_total = "loraplane_agent_vllm_metrics_scrapes_total"
    assert registry.get_sample_value(scrapes_total, {"outcome": "failed"}) == 1
    assert registry.get_sample_value(scrapes_total, {"outcome": "ok"}) == 2
    failing = True
    clock[0] += 5.1
    assert registry.get_sample_value("loraplane_agent_vllm_metrics_age_seconds") == 5.1
    assert await mirror.current() == "", "vLLM silent for longer than max_age_s: nothing passed on"
    assert calls == 4
