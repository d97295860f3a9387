"""What ``bench/agent_proxy_overhead.py`` runs beside the testbed's agent: the agent of
another commit (to compare two versions of the proxy in one run, on one vLLM), and a
py-spy profile of an agent under load."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.common import REPO
from bench.fanout_profile import inclusive
from bench.upload_throughput import py_spy, py_spy_binary
from devharness.processes import loraplane_command
from devharness.testbed import AgentProcess, AgentSpec
from loraplane.process import ChildProcess


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()


def archive(rev: str, work: Path) -> tuple[str, Path]:
    """The files of commit ``rev`` in ``work``/src (``git archive``): (commit, folder)."""
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    source = work / "src"
    source.mkdir(parents=True, exist_ok=True)
    tar = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True,
                         check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=tar, check=True)
    return commit, source


class CommitAgentProcess(AgentProcess):
    """``loraplane agent`` run from the source of one commit (``git archive``), in this
    environment: the same dependencies, another version of the project's code."""

    def __init__(self, spec: AgentSpec, log_dir: Path, source: Path, commit: str) -> None:
        self.source = source
        self.commit = commit
        super().__init__(spec, log_dir)

    @classmethod
    def beside(cls, agent: AgentProcess, rev: str, work: Path) -> CommitAgentProcess:
        """A second agent on ``agent``'s vLLM and registry, with its own id and cache."""
        commit, source = archive(rev, work)
        spec = agent.variant(agent_id=f"{agent.agent_id}-{commit[:10]}",
                             cache_dir=work / "cache")
        return cls(spec, work, source, commit)

    def _process(self) -> ChildProcess:
        flags = self.spec.argv(self.port)[len(loraplane_command()):]
        # PYTHONPATH comes before the editable install of this checkout on sys.path.
        env = {**self.spec.env(), "PYTHONPATH": str(self.source)}
        return ChildProcess(self.spec.agent_id,
                            [sys.executable, "-m", "loraplane_cli", *flags], env=env,
                            cwd=self.source,
                            log_path=self.log_dir / f"{self.spec.agent_id}.log",
                            own_group=True)


@contextmanager
def profile_agent(pid: int, output: Path) -> Iterator[None]:
    """py-spy on the agent while the block runs; prints where its samples were."""
    if not py_spy_binary().is_file():
        raise RuntimeError(f"--py-spy needs {py_spy_binary()}: .venv/bin/pip install py-spy")
    with py_spy(pid, output):
        yield
    print(profile_summary(output), file=sys.stderr)


def profile_summary(output: Path, top: int = 25) -> str:
    """The busy samples of a raw py-spy profile and each function's inclusive share."""
    summary = inclusive([output], top=top)
    lines = [f"py-spy of the agent, {summary['samples']} samples; inclusive share by function:"]
    lines += [f"  {share:5.1f}%  {name}" for name, share in summary["inclusive_pct"]]
    return "\n".join(lines)
