"""``bench.agent_setup.pin_cpus``: a process, its children and their threads, all of
them."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
from pathlib import Path

import pytest

from bench.agent_setup import cpu_list, descendants, pin_cpus


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

