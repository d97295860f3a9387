"""The PromQL of the dashboard's panels, apart from their layout so tests can read them.

``$__rate_interval`` is Grafana's: at least four scrape intervals, so a rate always has
samples. Ratios fall back to 0 with ``or 0 * ...``: an adapter with requests but no
error (or misses but no hit) yet has no such series, and would vanish from the panel.
"""

from __future__ import annotations

from dataclasses import dataclass

RATE = "[$__rate_interval]"


def rate(metric: str, by: str, selector: str = "") -> str:
    return f"sum by ({by}) (rate({metric}{selector}{RATE}))"


def quantile(q: float, metric: str, by: str = "adapter") -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{RATE})))"


def p95(metric: str, by: str = "adapter") -> str:
    return quantile(0.95, metric, by)


def ratio_or_zero(part: str, whole: str) -> str:
    """``part / whole`` per series of ``whole``, 0 where ``part`` has no series yet."""
    return f"({part} or 0 * {whole}) / {whole}"


RESOLVED = '{adapter!="_unresolved"}'
_REQUESTS = rate("loraplane_agent_requests_total", "adapter", RESOLVED)
_ERRORS = rate("loraplane_agent_request_errors_total", "adapter", RESOLVED)
_HITS = rate("loraplane_agent_cache_hits_total", "adapter")
_MISSES = rate("loraplane_agent_cache_misses_total", "adapter")
_LOOKUPS = f"({_HITS} + {_MISSES} or {_MISSES})"


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True, slots=True)
class PanelSpec:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]


def _panel(title: str, description: str, unit: str, *queries: tuple[str, str]) -> PanelSpec:
    return PanelSpec(title, description, unit, tuple(Query(e, legend) for e, legend in queries))


ADAPTERS = (
    _panel("Requests per adapter", "Proxied requests per second, all agents", "reqps",
           (_REQUESTS, "{{adapter}}")),
    _panel("Error ratio per adapter", "Failed requests / requests (alert above 1 %); "
           "requests refused before an adapter was known are left out", "percentunit",
           (ratio_or_zero(_ERRORS, _REQUESTS), "{{adapter}}")),
    _panel("Latency p95 per adapter", "To the last byte, and to the first chunk of "
           "streamed requests", "s",
           (p95("loraplane_agent_request_seconds"), "{{adapter}} total"),
           (p95("loraplane_agent_time_to_first_token_seconds"), "{{adapter}} first token")),
    _panel("Tokens per adapter", "Tokens per second from vLLM's usage", "short",
           (rate("loraplane_agent_tokens_total", "adapter, kind"), "{{adapter}} {{kind}}")),
    _panel("Cache hit rate per adapter", "Requests whose version was loaded / all "
           "(alert below 0.8)", "percentunit", (ratio_or_zero(_HITS, _LOOKUPS), "{{adapter}}")),
    _panel("Load time p95 per adapter", "Loading a version into vLLM (alert above 1 s)", "s",
           (p95("loraplane_agent_adapter_load_seconds"), "{{adapter}}")),
    _panel("Loaded adapter bytes", "Files of the loaded versions, per adapter and agent",
           "bytes", ("sum by (adapter, instance) (loraplane_agent_loaded_adapter_bytes)",
                     "{{adapter}} on {{instance}}")),
    _panel("Swaps per adapter", "Alias moves applied by the agents, by outcome", "short",
           (rate("loraplane_agent_swaps_total", "adapter, outcome"), "{{adapter}} {{outcome}}"),
           ),
)

FLEET = (
    _panel("Agents serving each alias's version", "Converged / expected fresh agents "
           "(alert when short for 10 minutes)", "short",
           ("max by (adapter, alias) (loraplane_registry_alias_agents_converged)",
            "{{adapter}}@{{alias}} serving"),
           ("max by (adapter, alias) (loraplane_registry_alias_agents_expected)",
            "{{adapter}}@{{alias}} expected")),
    _panel("Agents failing each alias's version", "Fresh agents that refused the version",
           "short", ("max by (adapter, alias) (loraplane_registry_alias_agents_failed)",
                     "{{adapter}}@{{alias}}")),
    _panel("Seconds since each agent's last report", "Agents report every 30 s (alert "
           "after 180 s)", "s",
           ("time() - max by (agent) (loraplane_registry_agent_last_report_timestamp_seconds)",
            "{{agent}}")),
    _panel("Uploads", "Version uploads per second by outcome", "reqps",
           (rate("loraplane_registry_uploads_total", "outcome"), "{{outcome}}")),
)

OUTBOX = (
    _panel("Outbox backlog", "Unpublished events, and the age of the oldest (alert "
           "above 5 minutes)", "short",
           ("max(loraplane_registry_outbox_pending)", "rows pending"),
           ("max(loraplane_registry_outbox_oldest_age_seconds)", "oldest, seconds")),
    _panel("Relay", "Events published and failed publish attempts per second", "short",
           (rate("loraplane_registry_events_published_total", "instance"),
            "published {{instance}}"),
           (rate("loraplane_registry_relay_errors_total", "instance"), "failed {{instance}}")),
    _panel("Relay publish latency p95", "One event to NATS until acknowledged", "s",
           (p95("loraplane_registry_relay_publish_seconds", "instance"), "{{instance}}")),
)

CANARIES = (
    _panel("Canary weight", "Each running canary's share of its alias's traffic; the "
           "paused ones, and how long (alert above an hour)", "short",
           ("max by (adapter, alias) (loraplane_registry_canary_weight_percent)",
            "{{adapter}}@{{alias}} %"),
           ("max by (adapter, alias) (loraplane_registry_canary_paused_seconds) > 0",
            "{{adapter}}@{{alias}} paused, s")),
    _panel("Canary against stable", "Each check of a running canary's last judged step, "
           "both versions on the same window", "short",
           ("max by (adapter, alias, metric, side) (loraplane_registry_canary_check_value)",
            "{{adapter}}@{{alias}} {{metric}} {{side}}")),
    _panel("Canaries rolled back", "Seconds since the analysis rolled back a canary of "
           "the alias (alert for an hour)", "s",
           ("time() - max by (adapter, alias) "
            "(loraplane_registry_canary_rolled_back_timestamp_seconds)", "{{adapter}}@{{alias}}")),
)

EVENT_LOOPS = (
    _panel("Event-loop lag p99", "How late each process's event loop ran a tick every "
           "0.1 s: what its requests wait behind work holding the loop (goal under 5 ms; "
           "alert above 50 ms for 10 minutes)", "s",
           (quantile(0.99, "loraplane_registry_event_loop_lag_seconds", "instance"),
            "registry {{instance}}"),
           (quantile(0.99, "loraplane_agent_event_loop_lag_seconds", "instance"),
            "agent {{instance}}")),
)

ROWS = (("Adapters", ADAPTERS), ("Fleet", FLEET), ("Canaries", CANARIES),
        ("Outbox and relay", OUTBOX), ("Event loops", EVENT_LOOPS))


def every_expr() -> list[str]:
    return [q.expr for _title, panels in ROWS for panel in panels for q in panel.queries]
