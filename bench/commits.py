"""Another commit's code beside this checkout's, in one run: the benchmarks' ratio
against the commit before a change (``--also-commit REV``).

``archive`` writes commit REV's files (``git archive``) to a folder; the process run
from there uses this environment's packages and that commit's project code, because
``PYTHONPATH`` comes before the editable install of this checkout on ``sys.path``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.common import REPO
from devharness.processes import loraplane_command
from devharness.testbed import AgentProcess, AgentSpec
from loraplane.process import ChildProcess


def archive(rev: str, work: Path) -> tuple[str, Path]:
    """The files of commit ``rev`` in ``work``/src (``git archive``): (commit, folder)."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.strip()
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
        env = {**self.spec.env(), "PYTHONPATH": str(self.source)}
        return ChildProcess(self.spec.agent_id,
                            [sys.executable, "-m", "loraplane_cli", *flags], env=env,
                            cwd=self.source,
                            log_path=self.log_dir / f"{self.spec.agent_id}.log",
                            own_group=True)
