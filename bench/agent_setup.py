"""What the agent benchmarks share: a one-host testbed, the agent's metrics and its log.

The testbed is ``devharness/testbed.py: running_testbed`` with one host: Postgres (a fresh
database on the machine's server), SeaweedFS as S3, a ``nats-server``, ``loraplane
registry serve``, one CPU vLLM with the tiny model and one ``loraplane agent``, each a
process of its own. Everything is stopped and the database dropped on exit.

Times that cross processes (the agent's log lines, NATS arrivals, the bench's own
requests) are wall-clock ``time.time()`` of this one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.common import busy_share, cpu_counters, machine_summary, percentile
from devharness.openai_client import RETRY_OVER_HTTP, Completion, OpenAIClient
from devharness.services import PostgresDatabase, start_s3_and_nats
from devharness.testbed import Testbed, metric, running_testbed
from devharness.vllm import ensure_tiny_model, ensure_vllm_env
from devharness.waiting import eventually
from inference_agent.metrics import STAGES

ADAPTER = "bench"
BASE_MODEL = "tiny-llama"
# Settings every bench agent gets: no periodic resync in the middle of a measurement.
QUIET_AGENT = {"resync_interval_s": "3600", "heartbeat_interval_s": "30"}

_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
_FLIP = re.compile(r"inference_agent\.control\.swap: (?P<adapter>[^@\s]+)@(?P<alias>\S+): "
                   r"(?P<old>\S+) -> (?P<new>\S+) \(revision (?P<revision>\d+), "
                   r"loaded=(?P<loaded>\w+)\)")
_EVENT = re.compile(r"inference_agent\.control\.reconciler: event: (?P<adapter>[^@\s]+)@"
                    r"(?P<alias>\S+) -> (?P<version>\d+) \(revision")
_MATERIALIZED = re.compile(r"inference_agent\.node\.materialize: materialized "
                           r"(?P<adapter>[^@\s]+)@(?P<version>\d+) into")


@contextlib.contextmanager
def bench_testbed(work: Path, *, max_loras: int, max_loaded: int,
                  agent_settings: Mapping[str, str] | None = None,
                  max_model_len: int = 2048, hosts: Sequence[str] = ("a",),
                  model_dir: Path | None = None, max_lora_rank: int = 16,
                  sqlite: bool = False) -> Iterator[Testbed]:
    """The testbed, one host (``a``) unless ``hosts`` names more, each with its vLLM and
    agent; needs the vLLM venv (scripts/vllm/install.sh). ``model_dir`` (with ``base/``)
    replaces the tiny model. ``sqlite``: the registry on an SQLite file (the embedded
    default) instead of Postgres.

    The registry puts presigned URLs in its events (``event_file_urls=on``), so agents
    fetch files from S3 directly, as they do in production: there the registry
    authenticates to NATS, and the default (``auto``) turns the URLs on. The bench's
    NATS takes no credentials, so ``auto`` would leave them out."""
    python = ensure_vllm_env()
    model = model_dir or ensure_tiny_model(work / "tiny", python)
    with contextlib.ExitStack() as stack:
        s3, nats = start_s3_and_nats(stack, work)
        if sqlite:
            database_url = f"sqlite:///{work / 'registry.sqlite'}"
        else:
            database = PostgresDatabase()
            asyncio.run(database.create())
            stack.callback(lambda: asyncio.run(database.drop()))
            database_url = database.url
        settings = {**QUIET_AGENT, **(agent_settings or {})}
        testbed = stack.enter_context(running_testbed(
            work / "testbed", model_dir=model, vllm_python=python, database_url=database_url,
            nats=nats, s3=s3, hosts=hosts, max_loras=max_loras, max_loaded=max_loaded,
            max_model_len=max_model_len, max_lora_rank=max_lora_rank,
            agent_settings={h: settings for h in hosts},
            registry_settings={"event_file_urls": "on"}))
        yield testbed


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command name may hold spaces and parentheses: the ppid follows the last ")".
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def each_thread(pid: int, apply: Callable[[int], object]) -> int:
    """``apply`` to every thread of ``pid`` and of its descendants; how many took it
    (a thread that ended meanwhile is skipped)."""
    done = 0
    for process in descendants(pid):
        for task in Path(f"/proc/{process}/task").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                apply(int(task.name))
                done += 1
    return done


def pin_cpus(pid: int, cpus: set[int]) -> int:
    """Keep ``pid``, its descendants and all their threads on ``cpus``; how many threads.

    What a GPU host looks like to the rest of the stack: the model's compute off the
    cores the registry, agent and services run on (here: off one of the two)."""
    return each_thread(pid, lambda tid: os.sched_setaffinity(tid, cpus))


def cpu_list(text: str) -> set[int]:
    """``--vllm-cpus``: comma-separated CPU numbers this process may use."""
    try:
        cpus = {int(part) for part in text.split(",")}
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of CPU numbers: {text!r}") from None
    if not cpus <= os.sched_getaffinity(0):
        raise argparse.ArgumentTypeError(
            f"CPUs {sorted(cpus)} are not all among {sorted(os.sched_getaffinity(0))}")
    return cpus


async def wait_served(client: OpenAIClient, model: str, version_name: str,
                      timeout_s: float) -> Completion:
    """Ask ``model`` (one token) until ``version_name`` answers; that answer."""

    async def check() -> Completion | None:
        result = await client.complete(model, max_tokens=1)
        return result if result.ok and result.adapter == version_name else None

    return await eventually(check, timeout_s=timeout_s, retrying=RETRY_OVER_HTTP,
                            what=f"{model} served by {version_name}")


# --- the agent's /metrics ---------------------------------------------------------------


@dataclass(frozen=True)
class StageTotals:
    """Sum (seconds) and count of every stage histogram at one moment."""

    sums: dict[str, float]
    counts: dict[str, int]

    def minus(self, earlier: StageTotals) -> StageTotals:
        return StageTotals({s: self.sums[s] - earlier.sums[s] for s in STAGES},
                           {s: self.counts[s] - earlier.counts[s] for s in STAGES})


def stage_totals(metrics_text: str) -> StageTotals:
    name = "loraplane_agent_stage_seconds"
    return StageTotals({s: metric(metrics_text, f"{name}_sum", stage=s) for s in STAGES},
                       {s: int(metric(metrics_text, f"{name}_count", stage=s))
                        for s in STAGES})


def event_delays(metrics_text: str) -> tuple[float, int]:
    """Sum and count of the agent's ``event_delay_seconds`` (event commit -> receipt)."""
    name = "loraplane_agent_event_delay_seconds"
    return metric(metrics_text, f"{name}_sum"), int(metric(metrics_text, f"{name}_count"))


def mean_event_delay(before: tuple[float, int], after: tuple[float, int]) -> float | None:
    """The mean event delay between two ``event_delays`` readings; None if no event came."""
    if after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def by_label(metrics_text: str, name: str, label: str) -> dict[str, float]:
    """Samples of ``name`` summed per value of ``label``."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name:
                key = sample.labels.get(label, "")
                found[key] = found.get(key, 0.0) + sample.value
    return found


# --- the agent's log --------------------------------------------------------------------


def log_time(line: str) -> float | None:
    """The wall-clock time of a log line (``%(asctime)s``: local time, whole ms)."""
    found = _LOG_TIME.match(line)
    if found is None:
        return None
    return time.mktime(time.strptime(found.group(1), "%Y-%m-%d %H:%M:%S")) + \
        int(found.group(2)) / 1000


@dataclass(frozen=True)
class Flip:
    """One applied alias move, as the swapper logs it right after the route flips.

    ``at`` is the log record's time cut to whole milliseconds: the flip happened in
    ``[at - 0.001, at + 0.001)``, and before any request could be routed by it (the
    line is written in the same event-loop step as the flip).
    """

    at: float
    adapter: str
    alias: str
    old: int | None
    new: int | None
    revision: int
    loaded: bool


def _version(text: str) -> int | None:
    return None if text == "None" else int(text)


def flips(log_text: str, adapter: str, alias: str = "live") -> list[Flip]:
    found: list[Flip] = []
    for line in log_text.splitlines():
        match = _FLIP.search(line)
        at = log_time(line)
        if match is None or at is None:
            continue
        if match["adapter"] == adapter and match["alias"] == alias:
            found.append(Flip(at, adapter, alias, _version(match["old"]),
                              _version(match["new"]), int(match["revision"]),
                              match["loaded"] == "True"))
    return found


def _first_per_version(log_text: str, adapter: str, pattern: re.Pattern[str]
                       ) -> dict[int, float]:
    """version -> the time of the first line matching ``pattern`` for ``adapter``."""
    found: dict[int, float] = {}
    for line in log_text.splitlines():
        match = pattern.search(line)
        at = log_time(line)
        if match is not None and at is not None and match["adapter"] == adapter:
            found.setdefault(int(match["version"]), at)
    return found


def materialized(log_text: str, adapter: str) -> dict[int, float]:
    """version -> when its folder was renamed into the cache (fetch + validate done)."""
    return _first_per_version(log_text, adapter, _MATERIALIZED)


def events_received(log_text: str, adapter: str) -> dict[int, float]:
    """version -> when the agent took in the first alias move to it (its event log line)."""
    return _first_per_version(log_text, adapter, _EVENT)


def desired_reads(log_text: str, adapter: str) -> list[float]:
    """When each ``GET /v1/desired?...&adapter=NAME`` answered (httpx logs the answer):
    the agent's first act on an event for that adapter."""
    needle = "/v1/desired?base_model="
    tail = f"&adapter={adapter} "
    return [at for line in log_text.splitlines()
            if needle in line and tail in line and (at := log_time(line)) is not None]


def log_lines(log_text: str, *needles: str) -> list[str]:
    """Lines holding any of ``needles`` (warnings, errors...), for the report."""
    return [line for line in log_text.splitlines() if any(n in line for n in needles)]


# --- the machine --------------------------------------------------------------------------


def vllm_servers() -> int:
    """vLLM API servers running on the machine now (other helpers' included)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in argv:
            count += 1
    return count


class MachineLoad:
    """How busy the whole (shared) machine was between ``__enter__`` and ``__exit__``,
    and how many vLLM servers ran on it (this bench's one included)."""

    def __init__(self) -> None:
        self.summary: dict[str, Any] = machine_summary()
        self._start = cpu_counters()

    def __enter__(self) -> MachineLoad:
        self._start = cpu_counters()
        self.summary["vllm_servers_at_start"] = vllm_servers()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.summary["cpu_busy_share"] = round(busy_share(self._start, cpu_counters()), 2)
        self.summary["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        self.summary["vllm_servers_at_end"] = vllm_servers()


def ms(seconds: float) -> str:
    value = seconds * 1000
    return f"{value:.3f}" if abs(value) < 1 else f"{value:.1f}"


def cells(values: Sequence[float]) -> list[str]:
    """p50, p99, min, max (nearest rank) in ms."""
    return [ms(percentile(values, 50)), ms(percentile(values, 99)), ms(min(values)),
            ms(max(values))]


# --- command lines ------------------------------------------------------------------------


def sampling_parser(doc: str | None, *, samples: int, warmup: int,
                    what: str) -> argparse.ArgumentParser:
    """A parser with ``--samples``, ``--warmup``, ``--work-dir`` and ``--json-out``."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=samples,
                        help=f"measured {what} (default {samples})")
    parser.add_argument("--warmup", type=int, default=warmup,
                        help=f"{what} before those, not counted (default {warmup})")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    return parser


def parse_sampling(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.samples < 1 or args.warmup < 0:
        parser.error("--samples must be positive and --warmup not negative")
    return args
