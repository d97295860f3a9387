"""Ctrl-C on ``loraplane events --follow`` at the worst instant: inside httpx's pool lock.

A KeyboardInterrupt raised just after httpcore's connection-pool lock is acquired, before
the ``with`` block that releases it begins, leaves the lock held: the pool's own error
path, or the client's ``close`` on the way out, then waits on it forever. A real Ctrl-C
lands there only by chance (rarely, mostly on a loaded machine); here the follower sends
itself a real SIGINT at exactly that instant, in each of a poll's three sections under
the lock, once the event that arrived has been printed, against a real registry.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import IO

import pytest

from loraplane_cli.events import pulled_in_background
from tests.cli.conftest import RESTORE_SIGINT, RUN_CLI, ServedRegistry

# The CLI with a real SIGINT sent to itself right after the Nth acquire of the pool's lock
# (argv[1]); a poll takes it three times (queue the request, assign it a connection,
# release it), so 4..6 are the second poll's, after the first one's event was printed.
HOOK = """
import os, signal, sys
import httpcore._synchronization as sync
fire_at, acquired = int(sys.argv.pop(1)), 0
acquire = sync.ThreadLock.__enter__
def acquire_then_interrupt(lock):
    global acquired
    held = acquire(lock)
    acquired += 1
    if acquired == fire_at:
        print("interrupting inside the pool lock", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGINT)
    return held
sync.ThreadLock.__enter__ = acquire_then_interrupt
"""
START_TIMEOUT_S = 120.0  # a loaded machine imports the CLI slowly
EXIT_TIMEOUT_S = 30.0  # the bound the run was killed at; a working exit takes ~0 s


def _reader(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


def test_pulled_in_background_is_as_lazy_as_its_items_and_raises_their_error() -> None:
    made: list[tuple[int, bool]] = []

    def items() -> Iterator[int]:
        for n in (1, 2):
            # Made in a thread that blocks SIGINT, so Ctrl-C goes to the waiting one.
            made.append((n, threading.current_thread() is not threading.main_thread()
                         and signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ())))
            yield n
        raise ValueError("the registry said no")

    pulled = pulled_in_background(items())
    assert next(pulled) == 1 and made == [(1, True)]
    assert next(pulled) == 2 and made == [(1, True), (2, True)]
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, ())
    with pytest.raises(ValueError, match="said no"):
        next(pulled)
    assert list(pulled_in_background(iter("ab"))) == ["a", "b"]


@pytest.mark.e2e
@pytest.mark.parametrize("fire_at", [4, 5, 6], ids=["queueing", "assigning", "releasing"])
def test_ctrl_c_inside_the_pool_lock_exits_0_after_printing(served: ServedRegistry,
                                                            fire_at: int) -> None:
    name = f"follow-interrupt-{fire_at}"
    served.run("adapters", "create", name, "--base-model", "tiny-llama", "--tenant", "acme")
    end = int(served.run("--json", "events", "--limit", "100000").json()["next_after"])
    follower = subprocess.Popen(
        [sys.executable, "-c", "\n".join((RESTORE_SIGINT, HOOK, RUN_CLI)), str(fire_at),
         "--json", "events", "--follow", "--after", str(end - 1), "--interval", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=served.env())
    try:
        assert follower.stdout is not None and follower.stderr is not None
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=_reader, args=(follower.stderr, lines), daemon=True)
        reader.start()
        while "interrupting inside the pool lock" not in lines.get(timeout=START_TIMEOUT_S):
            pass
        try:
            code = follower.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit {EXIT_TIMEOUT_S:.0f} s after Ctrl-C inside the pool lock")
        reader.join(START_TIMEOUT_S)
        stderr = "".join(lines.queue)
        assert code == 0 and "Traceback" not in stderr, stderr
        event = json.loads(follower.stdout.readline())
        assert (event["seq"], event["type"], event["adapter"]) == (end, "adapter_created", name)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
