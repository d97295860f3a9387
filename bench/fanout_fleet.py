"""The fan-out benchmark's fleet: one registry (Postgres, SeaweedFS as S3, NATS), one
stand-in for vLLM (``devharness/vllm_standin.py``) listening on one port per agent, and
up to a hundred real ``loraplane agent`` processes, each pointed at its own port.
With ``also`` (``bench/fanout.py --also-commit REV``), every other agent runs the code
of commit REV (``git archive``, ``bench/commits.py``), the rest this checkout's.

Everything is a process of its own, stopped (and the database dropped) on exit. The
agents' reports are read straight from the registry's database, so watching them costs
the registry nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.commits import CommitAgentProcess, archive
from bench.common import REPO, proc_meminfo_kb
from bench.fanout_versus import LABELS, NEW, OLD, cpu_group
from bench.sched_probe import named
from devharness.processes import clean_env, http_probe
from devharness.services import NatsService, PostgresDatabase, start_s3_and_nats
from devharness.testbed import AgentProcess, AgentSpec, RegistryProcess, S3Bucket
from loraplane.process import ChildProcess

BASE_MODEL = "tiny-llama"
# Quiet agents: no periodic resync, vLLM metrics copy or heartbeat in the middle of a
# measurement (a hundred agents' heartbeats would be most of the registry's load).
# The inference credentials are re-read on their events; the 5 s poll (every agent's,
# 20 requests a second at 100 agents) would hide the cost of one push.
# A report waits for the whole swap however busy the machine (the default bound is
# 5 s), so each agent reports one push once and the bench can count it.
AGENT_SETTINGS = {"resync_interval_s": "3600", "heartbeat_interval_s": "600",
                  "vllm_metrics_interval_s": "60", "credentials_refresh_s": "600",
                  "status_settle_max_s": "600"}
# Above twice the heartbeat, as the README asks: no agent goes stale while it runs.
STALE_AFTER_S = 1800.0
# What one idle agent holds (measured: 80-84 MB RSS), with a margin, and what the
# machine (shared with other work) must keep free after the agents start.
AGENT_RSS_MB = 120
RESERVE_MB = 2048


def quiet_port(taken: set[int]) -> int:
    """A free port below the kernel's ephemeral range, not in ``taken`` (added to it).

    ``free_port`` hands out an ephemeral port, and a hundred agents opening connections
    took one of those before the agent it was meant for could bind it (two runs lost
    that way: "Address already in use"). Below the range, only a process binding that
    port on purpose can take it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in range(low - 1, 1024, -1):
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError(f"no free port below {low}")


class NoRoom(RuntimeError):
    """Starting more agents would leave the shared machine short of memory."""


def check_room(count: int) -> None:
    available_mb = proc_meminfo_kb("MemAvailable") // 1024
    needed_mb = count * AGENT_RSS_MB + RESERVE_MB
    if available_mb < needed_mb:
        raise NoRoom(f"{count} more agents need about {needed_mb} MB free (with a "
                     f"{RESERVE_MB} MB reserve); the machine has {available_mb} MB")


@dataclass(frozen=True)
class OtherCommit:
    """The commit half the fleet runs (``--also-commit``): as named, resolved, and its
    source (``git archive``)."""

    rev: str
    commit: str
    source: Path

    @classmethod
    def archived(cls, rev: str, work: Path) -> OtherCommit:
        commit, source = archive(rev, work)
        return cls(rev, commit, source)


class CommitAgent(CommitAgentProcess):
    """``CommitAgentProcess`` on the port the fleet picked (below the ephemeral range)."""

    def __init__(self, spec: AgentSpec, log_dir: Path, port: int, other: OtherCommit) -> None:
        self.source, self.commit = other.source, other.commit
        AgentProcess.__init__(self, spec, log_dir, port)


class StandInProcess:
    """``python -m devharness.vllm_standin`` with ``ports`` ports."""

    def __init__(self, work: Path, ports: int) -> None:
        self.ports_file = work / "standin-ports.json"
        argv = [sys.executable, "-m", "devharness.vllm_standin", "--ports", str(ports),
                "--ports-file", str(self.ports_file)]
        self.process = ChildProcess("vllm-standin", argv, log_path=work / "standin.log",
                                    env=clean_env({"PYTHONPATH": str(REPO)}), own_group=True)
        self.ports: list[int] = []

    def start(self, timeout_s: float = 60.0) -> None:
        self.process.start()
        self.process.wait_ready(
            lambda: None if self.ports_file.exists() else "no ports file yet", timeout_s)
        self.ports = json.loads(self.ports_file.read_text())["ports"]
        self.process.wait_ready(http_probe(f"{self.url(self.ports[0])}/v1/models"), timeout_s)

    @staticmethod
    def url(port: int) -> str:
        return f"http://127.0.0.1:{port}"

    def set_fault(self, model: str, **fault: float) -> None:
        """A fault of ``model`` on every port (``error_every``, ``delay_s``,
        ``load_status``: see devharness/vllm_standin.py)."""
        response = httpx.post(f"{self.url(self.ports[0])}/_standin/faults",
                              json={"model": model, **fault}, timeout=30)
        response.raise_for_status()

    def clear_faults(self) -> None:
        httpx.delete(f"{self.url(self.ports[0])}/_standin/faults", timeout=30
                     ).raise_for_status()

    def state(self, after: int = 0) -> dict[str, Any]:
        """The loads and unloads after the ``after`` first, and what each port has."""
        response = httpx.get(f"{self.url(self.ports[0])}/_standin/calls",
                             params={"after": after}, timeout=30)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result


@dataclass
class Fleet:
    work: Path
    registry: RegistryProcess
    nats: NatsService
    database: PostgresDatabase
    standin: StandInProcess
    agents: dict[str, AgentProcess] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    next_port: int = 0
    agent_ports: set[int] = field(default_factory=set)
    also: OtherCommit | None = None
    old_agents: set[str] = field(default_factory=set)

    def make_tokens(self, agent_ids: Iterable[str]) -> None:
        """Agent tokens made ahead, while the registry is idle: one busy serving a
        hundred agents answered a token request after more than 30 s."""
        for agent_id in agent_ids:
            self.tokens[agent_id] = self.registry.create_token("agent", agent_id)

    def add_agents(self, count: int, prefix: str = "agent",
                   settings: Mapping[str, str] | None = None) -> list[str]:
        """Start ``count`` new agents together, each on the next free stand-in port;
        return their ids once every one answers ready. ``settings``: the agents' own
        (``AGENT_SETTINGS`` by default)."""
        check_room(count)
        started = []
        for _ in range(count):
            port = self.standin.ports[self.next_port]
            agent_id = f"{prefix}-{self.next_port:03d}"
            self.next_port += 1
            token = self.tokens.pop(agent_id, None) or \
                self.registry.create_token("agent", agent_id)
            spec = AgentSpec(agent_id=agent_id, vllm_url=self.standin.url(port),
                             base_model=BASE_MODEL, cache_dir=self.work / "cache" / agent_id,
                             registry=self.registry.url, token=token, nats_url=self.nats.url,
                             max_loaded=256,
                             settings=AGENT_SETTINGS if settings is None else settings)
            agent = self.agents[agent_id] = self._agent(spec, self.next_port - 1)
            agent.process.start()
            started.append(agent_id)
        for agent_id in started:
            agent = self.agents[agent_id]
            # Each new agent reads and fetches every adapter at start: a hundred at once
            # on a shared 2-core machine took over 600 s.
            agent.process.wait_ready(http_probe(f"{agent.url}/readyz"), 1800, interval_s=0.5)
        return started

    def _agent(self, spec: AgentSpec, index: int) -> AgentProcess:
        """This checkout's agent; with ``also``, that commit's if ``index`` is odd."""
        port, log_dir = quiet_port(self.agent_ports), self.work / "agents"
        if self.also is None or index % 2 == 0:
            return AgentProcess(spec, log_dir, port)
        self.old_agents.add(spec.agent_id)
        return CommitAgent(spec, log_dir, port, self.also)

    def group_of(self, agent_id: str) -> str:
        """``OLD`` for an agent of the other commit, else ``NEW``."""
        return OLD if agent_id in self.old_agents else NEW

    def port_of(self, agent_id: str) -> int:
        return int(self.agents[agent_id].spec.vllm_url.rsplit(":", 1)[1])

    def stop_agents(self, agent_ids: Iterable[str]) -> None:
        """SIGTERM them all at once (each tells the registry it leaves), then wait."""
        ids = list(agent_ids)
        for agent_id in ids:
            self.agents[agent_id].process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        for agent_id in ids:
            agent = self.agents.pop(agent_id)
            # One signal only: a second one would cut the agent's shutdown short.
            while agent.process.running and time.monotonic() < deadline:
                time.sleep(0.05)
            agent.stop(grace_s=5)

    def live(self) -> list[str]:
        return sorted(self.agents)

    async def agent_fetches(self) -> dict[str, float]:
        """``source/result`` -> files the live agents fetched, from their ``/metrics``."""
        return {key.removeprefix("files "): value
                for key, value in (await self.agent_sums()).items()
                if key.startswith("files ")}

    async def agent_sums(self) -> dict[str, float]:
        """Sums over the live agents' ``/metrics``: ``files <source>/<result>`` (files
        fetched), and ``<stage> sum`` / ``<stage> count`` of each swap stage's seconds
        and of ``event_delay`` (an event's commit to the agent receiving it)."""
        found: dict[str, float] = {}
        async with httpx.AsyncClient(timeout=60) as client:
            for agent in self.agents.values():
                response = await client.get(f"{agent.url}/metrics")
                response.raise_for_status()
                for family in text_string_to_metric_families(response.text):
                    for sample in family.samples:
                        key = _sum_key(sample.name, sample.labels)
                        if key is not None:
                            found[key] = found.get(key, 0.0) + sample.value
        return found

    def process_groups(self) -> dict[str, list[int]]:
        """The processes a push passes through, by role, for CPU accounting."""
        return {"agents": [p for a in self.agents.values() if (p := a.process.pid)],
                "registry": [self.registry_pid()],
                "vllm stand-in": [p for p in (self.standin.process.pid,) if p],
                "seaweedfs": named("weed"), "nats": named("nats-server"),
                "postgres": named("postgres"),
                # This process: watching for the reports, and reading the stand-in.
                "bench": [os.getpid()], **self._version_groups()}

    def _version_groups(self) -> dict[str, list[int]]:
        """With ``also``: the agents of each version, apart."""
        if self.also is None:
            return {}
        return {cpu_group(label): [p for a_id, a in self.agents.items()
                                   if self.group_of(a_id) == label and (p := a.process.pid)]
                for label in LABELS}

    def registry_pid(self) -> int:
        pid = self.registry.process.pid
        assert pid is not None
        return pid


@contextlib.asynccontextmanager
async def running_fleet(work: Path, *, ports: int, stale_after_s: float = STALE_AFTER_S,
                        also: str | None = None,
                        registry_settings: Mapping[str, str] | None = None,
                        ) -> AsyncIterator[Fleet]:
    """``also``: a commit every other agent runs (see ``Fleet._agent``);
    ``registry_settings``: more settings of the registry (``RegistryProcess``)."""
    other = None if also is None else OtherCommit.archived(also, work / "also-commit")
    async with contextlib.AsyncExitStack() as stack:
        s3, nats = start_s3_and_nats(stack, work)
        database = PostgresDatabase()
        await database.create()
        stack.push_async_callback(database.drop)
        registry = RegistryProcess(work / "registry", database_url=database.url,
                                   nats_url=nats.url, blobs=S3Bucket(s3, "fanout"),
                                   settings={"agent_stale_after_s": str(stale_after_s),
                                             # The bench's NATS takes no credentials,
                                             # so "auto" would leave them out.
                                             "event_file_urls": "on",
                                             **(registry_settings or {})})
        registry.migrate()
        stack.callback(registry.stop)
        registry.start()
        standin = StandInProcess(work, ports)
        stack.callback(standin.process.stop)
        standin.start()
        fleet = Fleet(work, registry, nats, database, standin, also=other)
        stack.callback(lambda: [a.stop() for a in list(fleet.agents.values())])
        yield fleet


# --- what the registry saw ----------------------------------------------------------------


async def agent_reports(database: PostgresDatabase) -> dict[str, dict[str, Any]]:
    """agent id -> its last report and ``last_seen_at``, read from the database."""
    connection = await asyncpg.connect(database.url)
    try:
        rows = await connection.fetch("SELECT agent_id, status, last_seen_at FROM agents")
    finally:
        await connection.close()
    return {row["agent_id"]: {**json.loads(row["status"]), "_seen": row["last_seen_at"]}
            for row in rows}


def _sum_key(name: str, labels: dict[str, str]) -> str | None:
    """The key ``Fleet.agent_sums`` adds a sample to, or None to leave it out."""
    if name == "loraplane_agent_file_fetches_total":
        return f"files {labels['source']}/{labels['result']}"
    for prefix, stage in (("loraplane_agent_stage_seconds", labels.get("stage")),
                          ("loraplane_agent_event_delay_seconds", "event_delay")):
        for part in ("sum", "count"):
            if name == f"{prefix}_{part}":
                return f"{stage} {part}"
    return None


def requests_by_route(metrics_text: str) -> dict[str, float]:
    """``METHOD route`` -> requests the registry served, every status summed."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "loraplane_registry_requests_total":
                key = f"{sample.labels['method']} {sample.labels['route']}"
                found[key] = found.get(key, 0.0) + sample.value
    return found

