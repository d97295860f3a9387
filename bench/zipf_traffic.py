"""The traffic of ``bench/zipf_adapters.py``: a seeded Zipf stream over many adapters,
sent as streamed completions by a few closed-loop clients, timed to the first token."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from bench.common import percentile
from devharness.openai_client import limits

PROMPT = "The registry publishes"


def zipf_stream(adapters: int, length: int, *, s: float, seed: int) -> list[int]:
    """``length`` adapter indexes, index ``k`` drawn with weight ``1 / rank(k) ** s``;
    which index gets which rank is shuffled by the seed too (rank 1 is not index 0)."""
    rng = random.Random(seed)
    ranks = list(range(1, adapters + 1))
    rng.shuffle(ranks)
    weights = [1.0 / rank**s for rank in ranks]
    return rng.choices(range(adapters), weights=weights, k=length)


def lru_hits(stream: Sequence[int], capacity: int) -> list[bool]:
    """Whether each request of ``stream`` finds its adapter in an LRU set of
    ``capacity``, in send order: what an ideal cache of that size would do, the same
    yardstick for both systems."""
    held: OrderedDict[int, None] = OrderedDict()
    hits = []
    for item in stream:
        hits.append(item in held)
        held[item] = None
        held.move_to_end(item)
        if len(held) > capacity:
            held.popitem(last=False)
    return hits


@dataclass
class Sent:
    """One streamed request: seconds to its first token and to its end (None: failed)."""

    index: int
    ttft_s: float | None
    total_s: float | None
    error: str | None = None


async def _one(http: httpx.AsyncClient, index: int, model: str, max_tokens: int) -> Sent:
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "ignore_eos": True}
    started = time.perf_counter()
    first: float | None = None
    async with http.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raw = await response.aread()
            return Sent(index, None, None, f"{response.status_code} {raw[:200]!r}")
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {"):
                event = json.loads(line.removeprefix("data: "))
                # The first token, even one that decodes to no text yet (a part of
                # a UTF-8 character, with this byte-level tokenizer).
                if event.get("choices"):
                    first = time.perf_counter()
    ended = time.perf_counter()
    if first is None:
        return Sent(index, None, None, "no token in the stream")
    return Sent(index, first - started, ended - started)


async def send_stream(url: str, models: Sequence[str], *, concurrency: int, max_tokens: int,
                      headers: Mapping[str, str] | None = None) -> tuple[list[Sent], float]:
    """Send ``models`` in order by ``concurrency`` closed-loop clients; (results, seconds)."""
    queue = iter(enumerate(models))
    results: list[Sent] = []
    async with httpx.AsyncClient(base_url=url, timeout=300.0, headers=dict(headers or {}),
                                 limits=limits(concurrency)) as http:
        async def client() -> None:
            for index, model in queue:
                results.append(await _one(http, index, model, max_tokens))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    results.sort(key=lambda sent: sent.index)
    return results, elapsed


def _pcts(values: Sequence[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50_ms": round(percentile(values, 50) * 1000, 1),
            "p99_ms": round(percentile(values, 99) * 1000, 1)}


def ttft_summary(results: Sequence[Sent], hits: Sequence[bool]) -> dict[str, Any]:
    """TTFT percentiles of all requests, of LRU hits and of LRU misses; failures."""
    ok = [r for r in results if r.ttft_s is not None]
    by_hit = {True: [r.ttft_s for r in ok if hits[r.index] and r.ttft_s is not None],
              False: [r.ttft_s for r in ok if not hits[r.index] and r.ttft_s is not None]}
    return {"all": _pcts([r.ttft_s for r in ok if r.ttft_s is not None]),
            "hits": _pcts(by_hit[True]), "misses": _pcts(by_hit[False]),
            "failed": [r.error for r in results if r.error is not None][:5],
            "failures": sum(r.error is not None for r in results)}
