"""``bench.agent_setup.renice`` and ``pin_cpus``: a process, its children and their
threads, all of them."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
from pathlib import Path

import pytest

from bench.agent_setup import cpu_list, descendants, pin_cpus, renice


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


def test_pin_cpus_reaches_every_thread_of_every_descendant() -> None:
    cpu = min(os.sched_getaffinity(0))
    with subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & echo ready; wait"],
                          stdout=subprocess.PIPE, text=True,
                          start_new_session=True) as parent:
        try:
            assert parent.stdout is not None and parent.stdout.readline() == "ready\n"
            done = pin_cpus(parent.pid, {cpu})
            tasks = [int(t.name) for pid in descendants(parent.pid)
                     for t in Path(f"/proc/{pid}/task").iterdir()]
            assert done == len(tasks) >= 3
            assert all(os.sched_getaffinity(t) == {cpu} for t in tasks)
        finally:
            os.killpg(parent.pid, signal.SIGKILL)


def test_a_cpu_list_names_cpus_this_process_may_use() -> None:
    cpu = min(os.sched_getaffinity(0))
    assert cpu_list(str(cpu)) == {cpu}
    for bad in ("x", "1,,2", "9999"):
        with pytest.raises(argparse.ArgumentTypeError):
            cpu_list(bad)

