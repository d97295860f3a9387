"""The numbers of ``bench/agent_proxy_overhead.py``: windows in, one row per cell out.

A cell is one workload at one concurrency. Within a cell every round runs one window
per target, back to back, in an order that turns each round; so a round's windows
share the machine's mood of that moment, and the per-round ratio (a path's requests
per second over vLLM's own in the same round) is the unit whose spread is reported.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from bench.common import percentile, table

DIRECT = "vllm"


@dataclass
class Window:
    target: str  # DIRECT, or the name of a path through an agent or a floor proxy
    workload: str
    concurrency: int
    round: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    first_chunk: list[float] = field(default_factory=list)  # streams: time to first text
    failed: list[str] = field(default_factory=list)
    # CPU seconds of every proxy process (agents, floor proxies) in this window, by name.
    agent_cpu_s: dict[str, float] = field(default_factory=dict)
    vllm_running: float | None = None  # mean of vLLM's num_requests_running, sampled
    texts: dict[str, set[str]] = field(default_factory=dict)  # prompt -> outputs seen

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (normal approximation;
    0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, 1.96 * statistics.stdev(values) / math.sqrt(len(values))


def process_of(target: str) -> str:
    """The process a path goes through: "agent (rule)" is the same one as "agent"."""
    return target.split(" ", maxsplit=1)[0]


def idle_cpu_rate(windows: list[Window], agent: str) -> float:
    """CPU seconds per second the process ``agent`` spends while requests go to other
    processes: its own tasks (vLLM's metrics copied every 0.25 s, credentials,
    heartbeats). A window of another path through the same process is not idle."""
    others = [w for w in windows
              if agent in w.agent_cpu_s and process_of(w.target) != agent]
    seconds = sum(w.seconds for w in others)
    return sum(w.agent_cpu_s[agent] for w in others) / seconds if seconds else 0.0


def _pooled(windows: list[Window]) -> dict[str, Any]:
    latencies = [x for w in windows for x in w.latencies]
    first = [x for w in windows for x in w.first_chunk]
    return {"rps": len(latencies) / sum(w.seconds for w in windows),
            "n": len(latencies), "p50": percentile(latencies, 50) * 1000,
            "p99": percentile(latencies, 99) * 1000,
            "first_p50": percentile(first, 50) * 1000 if first else None,
            "failed": sum(len(w.failed) for w in windows),
            "running": _mean([w.vllm_running for w in windows])}


def _mean(values: list[float | None]) -> float | None:
    seen = [v for v in values if v is not None]
    return statistics.fmean(seen) if seen else None


def _distinct_outputs(windows: list[Window]) -> int:
    """The most different texts any one prompt got (1: every path answered alike)."""
    seen: dict[str, set[str]] = {}
    for window in windows:
        for prompt, texts in window.texts.items():
            seen.setdefault(prompt, set()).update(texts)
    return max((len(t) for t in seen.values()), default=0)


def _per_round(mine: list[Window], base: list[Window]) -> tuple[list[float], list[float]]:
    """Per round: requests/s ratio, and p50 added (ms)."""
    by_round = {w.round: w for w in base}
    ratios, added = [], []
    for window in mine:
        direct = by_round[window.round]
        if window.latencies and direct.latencies:
            ratios.append(window.rps / direct.rps)
            added.append((percentile(window.latencies, 50)
                          - percentile(direct.latencies, 50)) * 1000)
    return ratios, added


def rps_ratio_rounds(cell: list[Window], mine: str, base: str) -> list[float]:
    """Per round: requests per second of path ``mine`` over path ``base``."""
    rates: dict[int, dict[str, float]] = {}
    for window in cell:
        if window.target in (mine, base) and window.seconds > 0:
            rates.setdefault(window.round, {})[window.target] = window.rps
    return [r[mine] / r[base] for r in rates.values() if r.get(base) and mine in r]


def cell_row(cell: list[Window], agent: str) -> dict[str, Any]:
    """One path through an agent against vLLM directly, in one cell."""
    base_windows = [w for w in cell if w.target == DIRECT]
    mine_windows = [w for w in cell if w.target == agent]
    base, mine = _pooled(base_windows), _pooled(mine_windows)
    ratios, added = _per_round(mine_windows, base_windows)
    ratio, ratio_ci = mean_ci(ratios)
    # An agent of another commit (--also-commit): the current agent against it.
    current = rps_ratio_rounds(cell, "agent", agent) if "@" in agent else []
    added_p50, added_ci = mean_ci(added)
    process = process_of(agent)
    idle = idle_cpu_rate(cell, process)
    cpu = sum(w.agent_cpu_s.get(process, 0.0) for w in mine_windows)
    seconds = sum(w.seconds for w in mine_windows)
    return {
        "workload": cell[0].workload, "concurrency": cell[0].concurrency, "target": agent,
        "rounds": len(ratios), "rps": mine["rps"], "vllm_rps": base["rps"],
        "rps_ratio_mean": ratio, "rps_ratio_ci95": ratio_ci,
        "rps_ratio_pooled": mine["rps"] / base["rps"],
        "rps_ratio_per_round": ratios,
        "current_agent_rps_ratio": mean_ci(current) if current else None,
        "p50_ms": mine["p50"], "vllm_p50_ms": base["p50"],
        "p50_added_ms": mine["p50"] - base["p50"],
        "p50_added_per_round_mean_ms": added_p50, "p50_added_per_round_ci95_ms": added_ci,
        "p99_ms": mine["p99"], "vllm_p99_ms": base["p99"],
        "p99_added_ms": mine["p99"] - base["p99"],
        "first_chunk_p50_ms": mine["first_p50"], "vllm_first_chunk_p50_ms": base["first_p50"],
        "requests": [mine["n"], base["n"]], "failed": [mine["failed"], base["failed"]],
        # The agent's CPU per request it proxied, read from /proc: all of it, and net of
        # what it spends per second when it proxies nothing.
        "agent_cpu_ms_per_request": cpu / max(1, mine["n"]) * 1000,
        "agent_cpu_ms_per_request_net": (cpu - idle * seconds) / max(1, mine["n"]) * 1000,
        "agent_idle_cpu_share": idle,
        "vllm_running_mean": mine["running"], "vllm_running_mean_direct": base["running"],
        # Greedy on the same weights: 1 unless a path changed what vLLM computed.
        "max_distinct_outputs_per_prompt": _distinct_outputs(base_windows + mine_windows)}


def summarize(windows: list[Window]) -> list[dict[str, Any]]:
    """A row per path through a proxy in each cell, each against vLLM directly."""
    rows = []
    cells = dict.fromkeys((w.workload, w.concurrency) for w in windows)
    for workload, concurrency in cells:
        cell = [w for w in windows if w.workload == workload and w.concurrency == concurrency]
        agents = dict.fromkeys(w.target for w in cell if w.target != DIRECT)
        rows += [cell_row(cell, agent) for agent in agents]
    return rows


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "" if value is None else format(value, spec)


def render(rows: list[dict[str, Any]]) -> str:
    body = [[r["workload"], r["concurrency"], r["target"], r["rounds"],
             f"{r['rps']:.1f} ({r['vllm_rps']:.1f})",
             f"**{r['rps_ratio_mean']:.3f}** ± {r['rps_ratio_ci95']:.3f}",
             f"{min(r['rps_ratio_per_round']):.2f} to {max(r['rps_ratio_per_round']):.2f}",
             f"{r['p50_ms']:.2f} ({r['vllm_p50_ms']:.2f})", f"**{r['p50_added_ms']:+.2f}**",
             f"{r['p50_added_per_round_mean_ms']:+.2f} ± {r['p50_added_per_round_ci95_ms']:.2f}",
             f"{r['p99_ms']:.1f} ({r['vllm_p99_ms']:.1f})", f"{r['p99_added_ms']:+.1f}",
             _fmt(r["first_chunk_p50_ms"]) + (f" ({_fmt(r['vllm_first_chunk_p50_ms'])})"
                                               if r["first_chunk_p50_ms"] else ""),
             f"{r['agent_cpu_ms_per_request']:.2f} / {r['agent_cpu_ms_per_request_net']:.2f}",
             "/".join(map(str, r["requests"])), "/".join(map(str, r["failed"])),
             r["max_distinct_outputs_per_prompt"], _vs_current(r)] for r in rows]
    return table(["workload", "clients", "via", "rounds", "req/s (vLLM)",
                  "req/s ratio, mean ± 95% CI", "per round", "p50 ms (vLLM)",
                  "p50 added ms", "p50 added per round ms", "p99 ms (vLLM)", "p99 added ms",
                  "1st chunk p50 (vLLM)", "proxy CPU ms/req (net of idle)", "requests",
                  "failed", "outputs/prompt", "agent / this, req/s"], body)


def _vs_current(row: dict[str, Any]) -> str:
    ratio = row["current_agent_rps_ratio"]
    return "" if ratio is None else f"{ratio[0]:.3f} ± {ratio[1]:.3f}"


def commit_line(document: dict[str, Any], *extra: str) -> str:
    """The line a proxy benchmark ends with: the commit it measured, and the machine."""
    commit = document["commit"]
    parts = [f"commit {commit['commit']}{' (dirty)' if commit['dirty'] else ''}", *extra,
             f"machine: {document['machine']}"]
    return "; ".join(parts)
