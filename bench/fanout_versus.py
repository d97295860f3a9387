"""Two versions of the agent in one fan-out fleet (``bench/fanout.py --also-commit REV``):
every other agent runs commit REV's code, the rest this checkout's, against the same
registry, on the same pushes, in the same run.

Per push and per group (``new``: this checkout, ``old``: REV, whatever its age): from
the push being sent, the time to ``loaded`` and to ``reported`` (p50, p99, max over the
group's agents; with 50 agents a group, the p99 is its slowest agent) and the group's
CPU per agent (schedstat, the push's window). The unit compared is the push: its ratio
new / old of each figure, so both groups share the machine's mood of that moment; over
the pushes, the ratios' mean with a 95% interval (``bench/proxy_stats.py: mean_ci``)
and their range.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.common import percentile, table
from bench.proxy_stats import mean_ci

NEW = "new"  # this checkout's agents
OLD = "old"  # the agents of commit --also-commit
LABELS = (NEW, OLD)
TIMES = ("loaded", "reported")
STATS = ("p50", "p99", "max")
CPU = "cpu_ms_per_agent"


def cpu_group(label: str) -> str:
    """The name of a group's agents in the window's CPU groups (``WindowCpu``)."""
    return f"agents {label}"


def spread_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max of ``seconds``, in ms."""
    return {"p50": round(percentile(seconds, 50) * 1000, 1),
            "p99": round(percentile(seconds, 99) * 1000, 1),
            "max": round(max(seconds) * 1000, 1)}


def push_groups(times: Mapping[str, Mapping[str, float]], group_of: Callable[[str], str],
                cpu: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, Any]]:
    """Per group: its agents, their ``loaded`` and ``reported`` spread (ms) and CPU per
    agent (ms). ``times``: "loaded" / "reported" -> agent -> seconds after the push was
    sent; ``cpu``: the window's groups (``cpu_group(label)`` -> {"cpu_ms": ...})."""
    out: dict[str, dict[str, Any]] = {}
    for label in LABELS:
        agents = [a for a in times["loaded"] if group_of(a) == label]
        if not agents:
            continue
        row: dict[str, Any] = {"agents": len(agents)}
        for kind in TIMES:
            row[kind] = spread_ms([times[kind][a] for a in agents])
        row[CPU] = round(cpu[cpu_group(label)]["cpu_ms"] / len(agents), 2)
        out[label] = row
    return out


def measures() -> list[tuple[str, Callable[[Mapping[str, Any]], float]]]:
    """(name, how to read it from one group of one push) for every figure compared."""
    found: list[tuple[str, Callable[[Mapping[str, Any]], float]]] = [
        (f"{kind} {stat} ms", _reader(kind, stat)) for kind in TIMES for stat in STATS]
    found.append(("agent CPU ms per push", lambda group: float(group[CPU])))
    return found


def _reader(kind: str, stat: str) -> Callable[[Mapping[str, Any]], float]:
    return lambda group: float(group[kind][stat])


def versus(by_push: Sequence[Mapping[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One row per figure: its median over the pushes for each group, and the per-push
    ratio new / old (mean ± 95% interval, range, every value)."""
    pairs = [p for p in by_push if NEW in p and OLD in p]
    rows = []
    for name, read in measures():
        new = [read(p[NEW]) for p in pairs]
        old = [read(p[OLD]) for p in pairs]
        ratios = [n / o for n, o in zip(new, old, strict=True) if o > 0]
        if not ratios:
            continue
        mean, half = mean_ci(ratios)
        rows.append({"measure": name, "pushes": len(ratios),
                     "new_median": statistics.median(new),
                     "old_median": statistics.median(old),
                     "ratio_mean": round(mean, 4), "ratio_ci95": round(half, 4),
                     "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4),
                     "ratios": [round(r, 4) for r in ratios]})
    return rows


def render(rows: Sequence[Mapping[str, Any]], new: str, old: str) -> str:
    """The rows as a table; ``new`` and ``old`` name the two versions."""
    body = [[r["measure"], r["pushes"], f"{r['new_median']:.1f}", f"{r['old_median']:.1f}",
             f"**{r['ratio_mean']:.3f}** ± {r['ratio_ci95']:.3f}",
             f"{r['ratio_min']:.2f} to {r['ratio_max']:.2f}"] for r in rows]
    return table(["figure", "pushes", f"new ({new}), median", f"old ({old}), median",
                  "new / old per push, mean ± 95% CI", "range"], body)
