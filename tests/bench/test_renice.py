"""``bench.agent_setup.renice``: a process, its children and their threads, all of them."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from bench.agent_setup import descendants, renice


def niceness(task: Path) -> int:
    # Field 19 of stat, counted after the command name's closing parenthesis.
    return int(task.joinpath("stat").read_text().rpartition(")")[2].split()[16])


def test_renice_reaches_every_thread_of_every_descendant() -> None:
    # The shell says "ready" once it has forked both children.
    with subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & echo ready; wait"],
                          stdout=subprocess.PIPE, text=True,
                          start_new_session=True) as parent:
        try:
            assert parent.stdout is not None and parent.stdout.readline() == "ready\n"
            assert len(descendants(parent.pid)) == 3
            done = renice(parent.pid, 7)
            tasks = [t for pid in descendants(parent.pid)
                     for t in Path(f"/proc/{pid}/task").iterdir()]
            assert done == len(tasks) >= 3
            assert {niceness(t) for t in tasks} == {7}
        finally:
            os.killpg(parent.pid, signal.SIGKILL)
