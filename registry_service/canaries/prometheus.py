"""A canary's metrics read from Prometheus (``LORAPLANE_PROMETHEUS_URL``), as Flagger and
Argo read theirs: PromQL over the agents' request metrics, whose ``track`` label says
which side of a canary a request went to, over the step's window.

Per side: requests, 5xx answers, and the latency and time-to-first-token histograms
(``sum by (le)`` of their buckets' increase), from which ``analysis.checks`` takes the
p95s as it does from the agents' reports; load failures still come from the reports
(Prometheus has no series per canary version for them). The user's own ``queries`` are
checks too: their value must be at most their ``max``, and no value fails. A
Prometheus that does not answer makes the step inconclusive (never a promotion); a query
it refuses fails that check.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from loraplane.api.canaries import Canary, CanaryCheck, CanaryQuery, Verdict
from loraplane.events import CanaryTrack
from registry_service.canaries.analysis import VersionWindow
from registry_service.errors import InvalidInput

MAX_ANSWER_BYTES = 4 * 1024 * 1024
TIMEOUT_S = 10.0
_REQUESTS = "loraplane_agent_requests_total"
_SIDE = {
    "requests": "sum(increase(" + _REQUESTS + "{{{sel}}}[{window}]))",
    "errors": "sum(increase(" + _REQUESTS + '{{{sel},status=~"5.."}}[{window}]))',
    "latency": "sum by (le) (increase(loraplane_agent_request_seconds_bucket{{{sel}}}"
               "[{window}]))",
    "ttft": "sum by (le) (increase(loraplane_agent_time_to_first_token_seconds_bucket"
            "{{{sel}}}[{window}]))",
}


class PrometheusFailed(Exception):
    """Prometheus could not be asked (``refused``: it answered, and refused the query)."""

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


Sample = tuple[Mapping[str, str], float]


def uses_prometheus(canary: Canary, configured: bool) -> bool:
    source = canary.analysis.source
    return source == "prometheus" or (source == "auto" and configured)


def check_source(canary_analysis_source: str, queries: list[CanaryQuery],
                 configured: bool) -> None:
    """Refuse at the start what needs a Prometheus the registry was not given (422)."""
    if not configured and (canary_analysis_source == "prometheus" or queries):
        raise InvalidInput("this analysis reads Prometheus, and the registry has none: an "
                           "operator sets LORAPLANE_PROMETHEUS_URL (--prometheus-url)",
                           code="prometheus_not_configured")


def window(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds))}s"


def _label(value: str) -> str:
    return json.dumps(value)  # a PromQL string literal: quotes and backslashes escaped


@dataclass
class PrometheusSource:
    url: str
    http: httpx.AsyncClient

    async def query(self, expr: str) -> list[Sample]:
        """The instant vector (or scalar) ``expr`` gives now."""
        try:
            async with self.http.stream("GET", f"{self.url.rstrip('/')}/api/v1/query",
                                        params={"query": expr}, timeout=TIMEOUT_S) as answer:
                raw = await _bounded(answer)
        except (httpx.HTTPError, OSError) as exc:
            raise PrometheusFailed(f"Prometheus did not answer: {type(exc).__name__}",
                                   refused=False) from None
        return _samples(answer.status_code, raw)

    async def sides(self, canary: Canary, seconds: float
                    ) -> dict[CanaryTrack, VersionWindow]:
        """Both sides' windows over the last ``seconds``."""
        out: dict[CanaryTrack, VersionWindow] = {}
        for track in ("stable", "canary"):
            sel = f"adapter={_label(canary.adapter)},track={_label(track)}"
            got = {name: await self.query(template.format(sel=sel, window=window(seconds)))
                   for name, template in _SIDE.items()}
            out[track] = VersionWindow(requests=_total(got["requests"]),
                                       errors=_total(got["errors"]),
                                       latency=_buckets(got["latency"]),
                                       ttft=_buckets(got["ttft"]))
        return out

    async def checks(self, canary: Canary, seconds: float) -> list[CanaryCheck]:
        """The user's own queries, each a check of the canary."""
        return [await self._check(canary, query, seconds) for query in canary.analysis.queries]

    async def _check(self, canary: Canary, query: CanaryQuery, seconds: float) -> CanaryCheck:
        expr = fill(query.query, canary, seconds)
        try:
            samples = await self.query(expr)
        except PrometheusFailed as exc:
            return query_check(query, None, f"query {query.name}: {exc}",
                               "fail" if exc.refused else "inconclusive")
        if not samples:
            return query_check(query, None, f"query {query.name} gave no value", "fail")
        value = max(v for _labels, v in samples)
        passed = value <= query.max
        return query_check(query, value, f"query {query.name} gave {value:.4g} on the "
                           f"canary; the limit is {query.max:.4g}",
                           "pass" if passed else "fail")


def fill(template: str, canary: Canary, seconds: float) -> str:
    values = {"adapter": canary.adapter, "alias": canary.alias,
              "stable_version": str(canary.stable_version),
              "canary_version": str(canary.canary_version), "window": window(seconds)}
    for name, value in values.items():
        template = template.replace("{{" + name + "}}", value)
    return template


def query_check(query: CanaryQuery, value: float | None, detail: str,
                verdict: Verdict) -> CanaryCheck:
    return CanaryCheck(metric=f"query:{query.name}", stable=None, canary=value,
                       threshold=query.max, stable_requests=0, canary_requests=0,
                       verdict=verdict, detail=detail)


def unavailable(detail: str) -> CanaryCheck:
    """The step's metrics could not be read: inconclusive, never a promotion."""
    return CanaryCheck(metric="prometheus", stable=None, canary=None, threshold=0,
                       stable_requests=0, canary_requests=0, verdict="inconclusive",
                       detail=detail)


async def _bounded(answer: httpx.Response) -> bytes:
    data = bytearray()
    async for chunk in answer.aiter_bytes():
        data += chunk
        if len(data) > MAX_ANSWER_BYTES:
            raise PrometheusFailed("Prometheus answered more than 4 MiB", refused=True)
    return bytes(data)


def _samples(status: int, raw: bytes) -> list[Sample]:
    try:
        body = json.loads(raw)
        if status == 200 and body["status"] == "success":
            return _result(body["data"])
        error = str(body.get("error", ""))[:300]
    except (ValueError, KeyError, TypeError, AttributeError):
        error = raw[:300].decode(errors="replace")
    raise PrometheusFailed(f"Prometheus refused it ({status}): {error}",
                           refused=400 <= status < 500)


def _result(data: Any) -> list[Sample]:
    if data["resultType"] == "scalar":
        return [({}, float(data["result"][1]))]
    return [(item["metric"], float(item["value"][1])) for item in data["result"]
            if not math.isnan(float(item["value"][1]))]


def _total(samples: list[Sample]) -> int:
    return round(sum(value for _labels, value in samples))


def _buckets(samples: list[Sample]) -> list[tuple[float, int]]:
    return sorted((float(labels["le"]), round(value)) for labels, value in samples
                  if "le" in labels)
