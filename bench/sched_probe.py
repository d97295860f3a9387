"""Where a slow request's wall time went, process by process, from the kernel's own
per-thread accounting (``/proc/<pid>/task/<tid>/schedstat``: time on a CPU, and time
runnable but waiting for one).

A request's wall time is the time its threads ran, the time they waited for a CPU
(the run queue: other processes had the cores), and the time they waited on something
else (a socket, a disk, a lock). Read before and after a push, the difference says,
for the registry and for everything it waits on, how much of the push was spent
queued behind other work on this machine's two cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.agent_setup import descendants
from devharness.testbed import metric
from registry_service.metrics import UPLOAD_PHASES


@dataclass(frozen=True)
class Sched:
    """Per thread of a group of processes: tid -> (ns on a CPU, ns waiting for one)."""

    threads: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def on_cpu(self) -> int:
        return sum(cpu for cpu, _ in self.threads.values())

    def minus(self, earlier: Sched) -> tuple[int, int]:
        """ns on a CPU and ns waiting between ``earlier`` and this read, over the threads
        alive now: one started since counts whole, one that ended since is left out
        (Postgres ends a backend with its connection), so both are lower bounds."""
        on_cpu = waiting = 0
        for tid, (cpu, queued) in self.threads.items():
            cpu_then, queued_then = earlier.threads.get(tid, (0, 0))
            on_cpu += cpu - cpu_then
            waiting += queued - queued_then
        return on_cpu, waiting


def thread_sched(pids: list[int]) -> Sched:
    """Every thread of ``pids``, read now."""
    threads = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = (task / "schedstat").read_text().split()
                threads[int(task.name)] = (int(fields[0]), int(fields[1]))
    return Sched(threads)


def cpu_ms(pid: int) -> float:
    """CPU one process (all its threads) has used so far, in ms."""
    return thread_sched([pid]).on_cpu / 1e6


def runs(pid: int) -> int:
    """Times the threads of one process have been put on a CPU so far (schedstat's
    third field): each wake-up of a thread is one, and each costs more than its own
    work on a crowded machine (cold caches after the switch)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[2])
    return total


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot, every core counted
    (``/proc/stat``: user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def named(command: str) -> list[int]:
    """Every process whose command name (``/proc/<pid>/comm``) is ``command``."""
    found = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError, ValueError):
            if comm.read_text().strip() == command:
                found.append(int(comm.parent.name))
    return found


def tree(pid: int | None) -> Callable[[], list[int]]:
    """``pid`` and its descendants, looked up again at each read."""
    return lambda: [] if pid is None else descendants(pid)


Groups = dict[str, list[int]]


class SchedProbe:
    """Reads every group's totals at once; ``groups`` names a way to find each one's
    processes. Finding them walks /proc, so it is done once (``find``) before what is
    measured, and each ``read`` opens only those processes' schedstat files."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]]) -> None:
        self.groups = groups

    def find(self) -> Groups:
        return {name: find() for name, find in self.groups.items()}

    @staticmethod
    def read(found: Groups) -> dict[str, Sched]:
        return {name: thread_sched(pids) for name, pids in found.items()}


def difference(after: dict[str, Sched], before: dict[str, Sched]) -> dict[str, dict[str, float]]:
    """Per group, ms on a CPU and ms waiting for one between two reads."""
    out = {}
    for name, late in after.items():
        on_cpu, waiting = late.minus(before.get(name, Sched()))
        out[name] = {"cpu_ms": round(on_cpu / 1e6, 1), "run_queue_ms": round(waiting / 1e6, 1)}
    return out


_PHASE_SUM = "loraplane_registry_upload_phase_seconds_sum"


def phase_sums(metrics_text: str) -> dict[str, float]:
    return {p: metric(metrics_text, _PHASE_SUM, phase=p) for p in UPLOAD_PHASES}


class PushProbe:
    """One push request seen from inside: the registry's own upload phases (its
    ``upload_phase_seconds``, read before and after) and every group's CPU and
    run-queue time between the push being sent and answered. Reads run in a thread,
    so the bench's loop (and its probers' clocks) does not stall on them."""

    def __init__(self, registry_metrics: Callable[[], str], sched: SchedProbe) -> None:
        self._metrics, self._sched = registry_metrics, sched
        self._phases: dict[str, float] = {}
        self._found: Groups = {}
        self._sent: dict[str, Sched] = {}
        self.request: dict[str, dict[str, float]] = {}

    async def before(self) -> None:
        # The last push's closing scrape (``phases``) stands for this one's opening: no
        # upload runs between two pushes.
        if not self._phases:
            self._phases = phase_sums(await asyncio.to_thread(self._metrics))
        # Postgres keeps its pooled connections' backends: found once per push is enough.
        self._found = await asyncio.to_thread(self._sched.find)
        self._sent = await asyncio.to_thread(self._sched.read, self._found)

    async def answered(self) -> None:
        after = await asyncio.to_thread(self._sched.read, self._found)
        self.request = difference(after, self._sent)

    async def phases(self) -> dict[str, float]:
        """Per phase, ms of this push (pushes are sequential)."""
        after = phase_sums(await asyncio.to_thread(self._metrics))
        spent = {p: round((after[p] - self._phases[p]) * 1000, 1) for p in UPLOAD_PHASES}
        self._phases = after
        return spent
