"""Small helpers shared by the benchmarks: process memory/CPU, percentiles, tables."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from devharness.processes import http_probe
from loraplane.netutil import free_port
from loraplane.process import ChildProcess

MIB = 1024 * 1024
REPO = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 90.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_status_kb(pid: int | str, field: str) -> int | None:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM, ...), or None when gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def proc_meminfo_kb(field: str) -> int:
    """A ``kB`` field of /proc/meminfo (Dirty, Writeback, ...)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM of ``pid`` to its current RSS (``echo 5 > clear_refs``); False if refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def cpu_seconds(pid: int | str) -> float | None:
    """User + system CPU time of a process (all its threads), from /proc/<pid>/stat."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


class CpuTime:
    """A process's CPU seconds over a block, in ``seconds`` after it (None when the
    process, or its pid, is unknown)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.seconds: float | None = None
        self._start: float | None = None

    def __enter__(self) -> CpuTime:
        self._start = None if self.pid is None else cpu_seconds(self.pid)
        return self

    def __exit__(self, *exc_info: object) -> None:
        end = None if self.pid is None else cpu_seconds(self.pid)
        if self._start is not None and end is not None:
            self.seconds = end - self._start


class RssSampler:
    """Polls VmRSS of one process in a thread; keeps the maximum and the samples.

    With ``reset_hwm`` the kernel's own high-water mark (VmHWM) is reset at the start,
    so ``peak_kb`` is exact even for a spike shorter than the polling interval. ``probe``
    is called at every sample too; its results are kept in ``probes``.
    """

    def __init__(self, pid: int, *, interval_s: float = 0.05, reset_hwm: bool = True,
                 probe: Callable[[], dict[str, int]] | None = None) -> None:
        self.pid = pid
        self.probe = probe
        self.probes: list[dict[str, int]] = []
        self.interval_s = interval_s
        self.reset_hwm = reset_hwm
        self.hwm_reset = False
        self.start_kb = 0
        self.max_sampled_kb = 0
        self.hwm_kb: int | None = None
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        # time.monotonic() is CLOCK_MONOTONIC: comparable with other processes' clocks.
        self.t0 = 0.0

    def __enter__(self) -> RssSampler:
        self.start_kb = proc_status_kb(self.pid, "VmRSS") or 0
        if self.reset_hwm:
            self.hwm_reset = reset_peak_rss(self.pid)
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            rss = proc_status_kb(self.pid, "VmRSS")
            if rss is None:
                return
            self.samples.append((time.monotonic() - self.t0, rss))
            if self.probe is not None:
                self.probes.append(self.probe())
            self.max_sampled_kb = max(self.max_sampled_kb, rss)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        if self.hwm_reset:
            self.hwm_kb = proc_status_kb(self.pid, "VmHWM")

    @property
    def peak_kb(self) -> int:
        return max(self.max_sampled_kb, self.hwm_kb or 0, self.start_kb)


class _Poller:
    """Calls ``_poll`` every ``interval_s`` in a thread, from ``with`` entry to exit."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url = url
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.wait(self.interval_s):
                self._poll(client)

    def _poll(self, client: httpx.Client) -> None:
        raise NotImplementedError

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()


class LatencyProbe(_Poller):
    """GETs ``url`` every ``interval_s`` in a thread; ``latencies_ms`` of every answer.

    Run during an upload, it shows whether the registry still answers other requests.
    """

    def __init__(self, url: str, *, interval_s: float = 0.1) -> None:
        super().__init__(url, interval_s)
        self.latencies_ms: list[float] = []
        self.started: list[float] = []  # time.monotonic() when each answered GET was sent
        self.errors = 0

    def _poll(self, client: httpx.Client) -> None:
        sent, t0 = time.monotonic(), time.perf_counter()
        try:
            client.get(self.url).raise_for_status()
        except httpx.HTTPError:
            self.errors += 1
            return
        self.latencies_ms.append((time.perf_counter() - t0) * 1000)
        self.started.append(sent)

    def summary(self, since: float | None = None) -> dict[str, float] | None:
        """Percentiles; with ``since`` (a monotonic time), when the slowest GET was sent."""
        if not self.latencies_ms:
            return None
        worst = max(range(len(self.latencies_ms)), key=self.latencies_ms.__getitem__)
        result = {"n": len(self.latencies_ms), "p50_ms": percentile(self.latencies_ms, 50),
                  "p99_ms": percentile(self.latencies_ms, 99),
                  "max_ms": self.latencies_ms[worst], "errors": self.errors}
        if since is not None:
            result["max_sent_at_s"] = self.started[worst] - since
        return result


class GaugeSampler(_Poller):
    """Reads one gauge from a Prometheus endpoint every ``interval_s``, in a thread.

    Run on vLLM's ``/metrics`` for ``vllm:num_requests_running`` while a window runs,
    it shows how full vLLM's batch was: a proxy can only cost throughput there by
    handing vLLM fewer requests at once.
    """

    def __init__(self, url: str, name: str, *, interval_s: float = 0.25) -> None:
        super().__init__(url, interval_s)
        self.name = name
        self.values: list[float] = []

    def _poll(self, client: httpx.Client) -> None:
        try:
            text = client.get(self.url).text
        except httpx.HTTPError:
            return
        value = gauge_value(text, self.name)
        if value is not None:
            self.values.append(value)

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None


def gauge_value(text: str, name: str) -> float | None:
    """The sum of the samples called ``name`` in Prometheus text; None if there are none."""
    values = []
    for line in text.splitlines():
        rest = line[len(name):] if line.startswith(name) else ""
        if rest[:1] == "{":
            rest = rest[rest.rfind("}") + 1:]
        elif rest[:1] != " ":
            continue
        values.append(float(rest.split()[0]))  # a timestamp may follow the value
    return sum(values) if values else None


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (the value at rank ceil(pct/100 * n))."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain, aligned text table (Markdown-compatible)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def run_in_work_dir(prefix: str, work_dir: Path | None,
                    run: Callable[[Path], Coroutine[Any, Any, dict[str, Any]]]
                    ) -> dict[str, Any]:
    """``run(folder)`` in a temporary folder (under ``work_dir``), removed after; a
    SIGTERM ends it as ^C does, so every process it started is stopped."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix=prefix, dir=work_dir) as tmp:
        return asyncio.run(run(Path(tmp)))


def write_json(document: Mapping[str, Any], out: Path | None) -> None:
    """A benchmark's results as JSON: to ``out``, or to stdout without one."""
    text = json.dumps(document, indent=2)
    if out is not None:
        out.write_text(text + "\n")
    else:
        print(text)


def record(benchmark: str, measured: Mapping[str, Any], machine: Mapping[str, Any],
           out: Path | None, **fields: Any) -> dict[str, Any]:
    """How a benchmark ends: a line naming the commit (``git_commit``) and the machine,
    then its JSON document (``write_json``), which is returned."""
    dirty = " (dirty)" if measured["dirty"] else ""
    print(f"commit {measured['commit']}{dirty}; machine: {machine}")
    document = {"benchmark": benchmark, **measured, "machine": machine, **fields}
    write_json(document, out)
    return document


def git_commit() -> dict[str, Any]:
    """The commit a benchmark measured, and whether the work tree differed from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def cpu_counters() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def busy_share(start: tuple[int, int], end: tuple[int, int]) -> float:
    """Share of the machine's CPU time (all processes, ours included) that was busy."""
    total = end[1] - start[1]
    return (end[0] - start[0]) / total if total else 0.0


def machine_summary() -> dict[str, object]:
    """Cores, memory and load: the benchmarks run on shared machines, so say how busy."""
    mem_kb = proc_status_kb("self", "VmRSS")
    total_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            total_kb = int(line.split()[1])
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "mem_gib": round(total_kb / MIB, 1),
        "loadavg_1m_at_start": round(load[0], 2),
        "bench_rss_mib": round((mem_kb or 0) / 1024, 1),
    }


@dataclass
class Registry:
    process: ChildProcess
    url: str
    log: Path
    data_dir: Path

    @property
    def pid(self) -> int:
        pid = self.process.pid
        if pid is None:
            raise RuntimeError("the registry is not running")
        return pid


@contextmanager
def running_registry(data_dir: Path, settings_env: dict[str, str], *,
                     startup_timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[Registry]:
    """``loraplane registry serve`` as a process of its own, set up by ``LORAPLANE_*`` only.

    Nothing else of this environment's ``LORAPLANE_*`` reaches it. Stopped (SIGTERM,
    then SIGKILL) when the block ends.
    """
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLANE_")}
    env.update({"LORAPLANE_DATA_DIR": str(data_dir), "LORAPLANE_LOG_LEVEL": "warning",
                **settings_env})
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"{data_dir.name}.log"
    log_path.unlink(missing_ok=True)  # one run per log
    argv = [sys.executable, "-m", "loraplane_cli", "registry", "serve",
            "--host", "127.0.0.1", "--port", str(port)]
    process = ChildProcess("the registry", argv, log_path=log_path, env=env, cwd=REPO)
    registry = Registry(process, f"http://127.0.0.1:{port}", log_path, data_dir)
    with process:
        process.wait_ready(http_probe(f"{registry.url}/readyz"), startup_timeout_s,
                           interval_s=0.2)
        yield registry


