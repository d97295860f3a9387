"""``bench/sched_probe.py``: CPU and run-queue time per process group, from schedstat."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from bench.sched_probe import SchedProbe, difference, machine_busy_s, thread_sched


def spin(rounds: int = 200_000) -> int:
    return sum(i * i for i in range(rounds))


def test_a_group_counts_its_work_and_a_process_gone_since_takes_nothing_back() -> None:
    child = subprocess.Popen([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"])
    probe = SchedProbe({"me": lambda: [os.getpid()], "child": lambda: [child.pid]})
    found = probe.find()
    before, busy = probe.read(found), machine_busy_s()
    spin()
    started = threading.Thread(target=spin)  # begun after the first read: counted whole
    started.start()
    started.join()
    child.wait()  # gone before the second read: left out, never negative
    spent = difference(probe.read(found), before)
    assert spent["me"]["cpu_ms"] > 0 and spent["me"]["run_queue_ms"] >= 0
    assert spent["child"] == {"cpu_ms": 0.0, "run_queue_ms": 0.0}
    assert machine_busy_s() > busy


def test_every_thread_of_a_process_is_read() -> None:
    hold = threading.Event()
    thread = threading.Thread(target=hold.wait)
    thread.start()
    try:
        assert thread.native_id in thread_sched([os.getpid()]).threads
        assert threading.main_thread().native_id in thread_sched([os.getpid()]).threads
    finally:
        hold.set()
        thread.join()
