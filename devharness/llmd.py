"""llm-d's endpoint picker, as far as it reads a model server's ``/metrics``, in Python.

The picker (llm-d's router; the Gateway API Inference Extension's EPP before it) scrapes
each endpoint and keeps, per endpoint, what its core metrics extractor reads for the
``vllm`` engine; its LoRA affinity scorer then scores the endpoint for a request's
model. This module does the same, following llm-d-router's
``pkg/epp/framework/plugins/datalayer/extractor/metrics`` (``extractor.go``,
``spec.go``, ``loraspec.go``) and ``scorer/loraaffinity/lora_affinity.go``:

- each plain series (queue lengths, KV-cache usage, cache config) is the family's first
  series without a timestamp (the Go code keeps the one with the newest timestamp, and
  a series without one counts as 0);
- ``vllm:lora_requests_info`` is the series with the highest *value*; its
  ``running_lora_adapters`` and ``waiting_lora_adapters`` are split on commas and
  trimmed, ``max_lora`` is an integer;
- the score: 1.0 when the model is running, else 0.8 when the running and waiting names
  together are fewer than ``max_lora``, else 0.6 when it is waiting, else 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

LORA_INFO = "vllm:lora_requests_info"
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"


@dataclass
class EndpointMetrics:
    """What the picker keeps of one scrape of one endpoint (absent series stay None)."""

    active_models: set[str] = field(default_factory=set)
    waiting_models: set[str] = field(default_factory=set)
    max_active_models: int = 0
    waiting_queue: float | None = None
    running_requests: float | None = None
    kv_cache_usage: float | None = None
    cache_block_size: int | None = None
    cache_num_blocks: int | None = None


def _adapters(csv: str) -> set[str]:
    return {name.strip() for name in csv.split(",") if name.strip()}


def families(text: str) -> dict[str, list[Sample]]:
    """Samples per family name of a Prometheus text exposition."""
    return {family.name: list(family.samples)
            for family in text_string_to_metric_families(text)}


def parse_endpoint(text: str) -> EndpointMetrics:
    """Read one scrape the way the picker's extractor does for the ``vllm`` engine."""
    found = families(text)
    metrics = EndpointMetrics()
    first = {name: samples[0] for name, samples in found.items() if samples}
    if WAITING in first:
        metrics.waiting_queue = first[WAITING].value
    if RUNNING in first:
        metrics.running_requests = first[RUNNING].value
    if KV_USAGE in first:
        metrics.kv_cache_usage = first[KV_USAGE].value
    if CACHE_CONFIG in first:
        labels = first[CACHE_CONFIG].labels
        metrics.cache_block_size = int(labels.get("block_size") or 0)
        metrics.cache_num_blocks = int(labels["num_gpu_blocks"]) \
            if labels.get("num_gpu_blocks") else None
    lora = found.get(LORA_INFO, [])
    if lora:
        newest = max(lora, key=lambda sample: sample.value)
        metrics.active_models = _adapters(newest.labels.get("running_lora_adapters", ""))
        metrics.waiting_models = _adapters(newest.labels.get("waiting_lora_adapters", ""))
        if newest.labels.get("max_lora"):
            metrics.max_active_models = int(newest.labels["max_lora"])
    return metrics


def lora_affinity_score(metrics: EndpointMetrics, model: str) -> float:
    """llm-d's ``lora-affinity-scorer`` for a request whose model is ``model``."""
    if model in metrics.active_models:
        return 1.0
    if len(metrics.active_models) + len(metrics.waiting_models) < metrics.max_active_models:
        return 0.8
    if model in metrics.waiting_models:
        return 0.6
    return 0.0
