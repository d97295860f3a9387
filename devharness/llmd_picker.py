"""A client that picks an agent per request the way llm-d's endpoint picker does.

Before each request it scrapes every agent's ``/metrics/model-server`` (read with
``devharness/llmd.py``, as the picker's extractor reads it) and scores each agent for
the request's model with the scorers and weights deploy/kubernetes/epp.yaml configures:

- ``lora-affinity-scorer`` (weight 3): 1.0 when the adapter is listed as running, 0.8
  when the agent has spare capacity (fewer names listed than ``max_lora``), 0.6 when it
  is listed as waiting, else 0;
- ``queue-scorer`` (weight 1): the waiting queue, min-max normalised over the agents
  (fewest waiting: 1.0; all equal: 1.0 each);
- ``kv-cache-utilization-scorer`` (weight 1): 1 minus the KV-cache usage.

The highest weighted sum wins (``max-score-picker``); ties are broken at random. With
requests sent one at a time the queue term is equal everywhere and the KV term differs by
a little, so affinity decides; ``Weights(affinity=1, queue=0, kv_cache=0)`` scores by
affinity alone. The random policy scrapes too, only to record whether its pick was hot.

Whether a request found its adapter hot is counted twice: by the client (the agent it
chose listed the adapter as running in the scrape just before) and by the agents
themselves (``loraplane_agent_cache_hits_total`` / ``_misses_total``, deltas over the
run). Requests go one at a time, so nothing moves between a scrape and its request and
the two counts agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import httpx

from devharness.llmd import EndpointMetrics, lora_affinity_score, parse_endpoint
from devharness.openai_client import RETRY_OVER_HTTP, OpenAIClient
from devharness.testbed import metric
from devharness.waiting import eventually
from inference_agent.serving.model_server_metrics import MODEL_SERVER_METRICS_PATH
from loraplane.client import AsyncRegistryClient, NotFound

HITS = "loraplane_agent_cache_hits_total"
MISSES = "loraplane_agent_cache_misses_total"
T = TypeVar("T")


@dataclass(frozen=True)
class Weights:
    """Scorer weights; the defaults are deploy/kubernetes/epp.yaml's."""

    affinity: float = 3.0
    queue: float = 1.0
    kv_cache: float = 1.0


def queue_scores(endpoints: Sequence[EndpointMetrics]) -> list[float]:
    """The queue scorer: fewer waiting requests score higher, normalised over the pool."""
    queues = [e.waiting_queue or 0.0 for e in endpoints]
    low, high = min(queues), max(queues)
    if high == low:
        return [1.0 for _ in queues]
    return [(high - q) / (high - low) for q in queues]


def scores(endpoints: Sequence[EndpointMetrics], model: str,
           weights: Weights = Weights()) -> list[float]:
    """Each endpoint's weighted score for a request naming ``model``."""
    queue = queue_scores(endpoints)
    return [weights.affinity * lora_affinity_score(e, model) + weights.queue * q
            + weights.kv_cache * (1.0 - (e.kv_cache_usage or 0.0))
            for e, q in zip(endpoints, queue, strict=True)]


def free_slots(endpoint: EndpointMetrics) -> int:
    """Versions the endpoint can still load without evicting one: ``max_lora`` counts
    the names listed plus one per free slot (see model_server_metrics.py)."""
    listed = len(endpoint.active_models) + len(endpoint.waiting_models)
    return max(0, endpoint.max_active_models - listed)


def best(values: Sequence[float], rng: random.Random) -> int:
    """The index of the highest value; ties broken at random."""
    top = max(values)
    return rng.choice([i for i, v in enumerate(values) if v == top])


class Policy(Protocol):
    name: str

    def choose(self, endpoints: Sequence[EndpointMetrics], model: str) -> int: ...


@dataclass
class LlmdPolicy:
    """llm-d's scorers and max-score picker."""

    rng: random.Random
    weights: Weights = Weights()
    name: str = "llm-d scorer"

    def choose(self, endpoints: Sequence[EndpointMetrics], model: str) -> int:
        return best(scores(endpoints, model, self.weights), self.rng)


@dataclass
class RandomPolicy:
    """Any agent, uniformly: what a gateway without the adapter's whereabouts does."""

    rng: random.Random
    name: str = "random"

    def choose(self, endpoints: Sequence[EndpointMetrics], model: str) -> int:
        return self.rng.randrange(len(endpoints))


@dataclass
class PolicyRun:
    """One policy's requests and what they found."""

    policy: str
    requests: int = 0
    failed: int = 0
    hot_at_pick: int = 0  # the chosen agent listed the adapter as running
    hot_elsewhere: int = 0  # another agent listed it, the chosen one did not
    agent_hits: int = 0
    agent_misses: int = 0
    per_agent: Counter[str] = field(default_factory=Counter)

    @property
    def hit_rate(self) -> float:
        """Requests that found their adapter loaded, as the agents counted them."""
        total = self.agent_hits + self.agent_misses
        return self.agent_hits / total if total else 0.0

    def summary(self) -> dict[str, object]:
        return {"policy": self.policy, "requests": self.requests, "failed": self.failed,
                "hit_rate": round(self.hit_rate, 3), "agent_hits": self.agent_hits,
                "agent_misses": self.agent_misses, "hot_at_pick": self.hot_at_pick,
                "hot_elsewhere": self.hot_elsewhere, "per_agent": dict(self.per_agent)}


def request_stream(items: Sequence[T], count: int, rng: random.Random,
                   zipf_s: float = 0.0) -> list[T]:
    """``count`` draws from ``items``, the k-th with weight 1/k**zipf_s (0: uniform)."""
    weights = [1.0 / (rank ** zipf_s) for rank in range(1, len(items) + 1)]
    return rng.choices(list(items), weights=weights, k=count)


class Fleet:
    """The agents a picker chooses among: each one's URL and an inference client."""

    def __init__(self, urls: Mapping[str, str], token: str, timeout_s: float = 120.0) -> None:
        self.names = list(urls)
        self._urls = dict(urls)
        self._http = httpx.AsyncClient(timeout=timeout_s)
        self._clients = {name: OpenAIClient(url, token=token, timeout_s=timeout_s)
                         for name, url in urls.items()}

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._http.aclose()
        for client in self._clients.values():
            await client.aclose()

    async def scrape(self) -> list[EndpointMetrics]:
        """Every agent's model-server page, read as the picker reads it."""
        pages = await asyncio.gather(*(self._get(f"{self._urls[n]}{MODEL_SERVER_METRICS_PATH}")
                                       for n in self.names))
        return [parse_endpoint(page) for page in pages]

    async def cache_counts(self) -> tuple[int, int]:
        """(hits, misses) the agents' caches counted so far, summed over the fleet."""
        pages = await asyncio.gather(*(self._get(f"{self._urls[n]}/metrics")
                                       for n in self.names))
        return (int(sum(metric(p, HITS) for p in pages)),
                int(sum(metric(p, MISSES) for p in pages)))

    async def wait_free(self, slots: int, timeout_s: float = 60.0) -> None:
        """Until the fleet has ``slots`` free slots (deleted versions drained and
        unloaded)."""

        async def room() -> bool:
            return sum(free_slots(e) for e in await self.scrape()) >= slots

        await eventually(room, timeout_s=timeout_s, retrying=RETRY_OVER_HTTP,
                         what=f"{slots} free slots in the fleet")

    async def _get(self, url: str) -> str:
        response = await self._http.get(url)
        response.raise_for_status()
        return response.text

    async def run(self, policy: Policy, models: Sequence[str], *,
                  max_tokens: int = 1) -> PolicyRun:
        """Send ``models`` one request at a time, each to the agent ``policy`` picks."""
        run = PolicyRun(policy.name)
        hits0, misses0 = await self.cache_counts()
        for model in models:
            endpoints = await self.scrape()
            chosen = policy.choose(endpoints, model)
            hot = [model in e.active_models for e in endpoints]
            run.hot_at_pick += hot[chosen]
            run.hot_elsewhere += any(hot) and not hot[chosen]
            name = self.names[chosen]
            answer = await self._clients[name].complete(model, max_tokens=max_tokens)
            run.requests += 1
            run.failed += not answer.ok
            run.per_agent[name] += 1
        hits1, misses1 = await self.cache_counts()
        run.agent_hits, run.agent_misses = hits1 - hits0, misses1 - misses0
        return run


# --- one comparison: the same request stream at random, then through the picker -------


@dataclass(frozen=True)
class Setup:
    """What a comparison runs on: the registry, the agents and the adapters' files."""

    api: AsyncRegistryClient
    agents: Mapping[str, str]  # agent id -> its URL
    inference_token: str
    adapter_dir: Path
    base_model: str
    tenant: str
    slots: int  # versions the whole fleet can hold (--max-loaded summed)


@dataclass
class Comparison:
    adapters: int
    requests: int
    zipf_s: float
    distinct: int  # adapters the stream asked for at least once
    at_random: PolicyRun
    by_picker: PolicyRun


async def compare(setup: Setup, prefix: str, *, adapters: int, requests: int,
                  zipf_s: float = 0.0, seed: int = 9) -> Comparison:
    """Send one seeded stream of ``requests`` over ``adapters`` adapters to random agents,
    then (over adapters of its own, the same files under other names) through the
    picker. Between the two, the random run's adapters are deleted and their slots
    freed, so the picker starts with as many free slots as it has adapters (or the whole
    fleet's), whatever the fleet held before."""
    order = request_stream(range(adapters), requests, random.Random(seed), zipf_s)
    rand = [f"{prefix}-r{i}" for i in range(adapters)]
    pick = [f"{prefix}-p{i}" for i in range(adapters)]
    try:
        await _publish(setup, rand + pick)
        async with Fleet(setup.agents, setup.inference_token) as fleet:
            at_random = await fleet.run(RandomPolicy(random.Random(seed + 1)),
                                        [rand[i] for i in order])
            await _delete(setup.api, rand)
            await fleet.wait_free(min(adapters, setup.slots))
            by_picker = await fleet.run(LlmdPolicy(random.Random(seed + 2)),
                                        [pick[i] for i in order])
    finally:
        await _delete(setup.api, rand + pick)
    return Comparison(adapters=adapters, requests=requests, zipf_s=zipf_s,
                      distinct=len(set(order)), at_random=at_random, by_picker=by_picker)


async def _publish(setup: Setup, names: Sequence[str]) -> None:
    for name in names:
        await setup.api.create_adapter(name, setup.base_model, tenant=setup.tenant)
        await setup.api.push(name, setup.adapter_dir, aliases=["live"])

    async def everywhere() -> bool:
        for name in names:
            rollout = await setup.api.rollout(name)
            serving = {e.agent_id for a in rollout.aliases for e in a.serving
                       if e.state == "serving"}
            if serving != set(setup.agents):
                return False
        return True

    await eventually(everywhere, timeout_s=120, retrying=RETRY_OVER_HTTP,
                     what="every adapter routed on every agent")


async def _delete(api: AsyncRegistryClient, names: Sequence[str]) -> None:
    for name in names:
        with contextlib.suppress(NotFound):
            await api.delete_adapter(name)
