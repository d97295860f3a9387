"""Python stacks of the testbed's processes with py-spy (``pip install py-spy``).

Two views: ``Recording`` samples whole processes for a whole run (raw collapsed stacks,
for "where does the CPU go"), and ``StallDumps`` takes a snapshot of every thread of the
named processes while one operation is slower than a threshold, again and again until it
ends: a tail that happens once in 200 pushes is caught in the act, and the dump says what
each process was doing then (a lock, a socket read, the event loop idle in ``select``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path


def py_spy() -> Path:
    """The py-spy beside this interpreter."""
    return Path(sys.executable).parent / "py-spy"


def require_py_spy() -> None:
    if not py_spy().is_file():
        raise SystemExit(f"--py-spy needs {py_spy()} (.venv/bin/pip install py-spy)")


@contextlib.contextmanager
def recording(pids: Mapping[str, int], folder: Path, *, rate: int = 100) -> Iterator[None]:
    """``py-spy record`` of each process (idle threads included) while the block runs;
    one ``<name>.txt`` of raw collapsed stacks per process in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    spies = [subprocess.Popen([str(py_spy()), "record", "-p", str(pid), "-o",
                               str(folder / f"{name}.txt"), "--format", "raw", "-r",
                               str(rate), "--threads", "--idle", "--nonblocking"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name, pid in pids.items()]
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            try:
                spy.wait(60)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()


def dump(pid: int) -> str:
    """One ``py-spy dump`` of every thread of ``pid`` (not paused: ``--nonblocking``)."""
    done = subprocess.run([str(py_spy()), "dump", "--pid", str(pid), "--nonblocking"],
                          capture_output=True, text=True, timeout=30, check=False)
    return done.stdout + done.stderr


class StallDumps:
    """Dumps ``pids`` every ``interval_s`` while an operation outlasts ``after_s``."""

    def __init__(self, pids: Mapping[str, int], out: Path, *, after_s: float,
                 interval_s: float = 0.2, max_dumps: int = 10) -> None:
        self.pids = dict(pids)
        self.out = out
        self.after_s = after_s
        self.interval_s = interval_s
        self.max_dumps = max_dumps
        self.stalls = 0

    @contextlib.asynccontextmanager
    async def watching(self, label: str, started: float) -> AsyncIterator[None]:
        """Watch the block; ``started`` is its wall-clock start (``time.time()``)."""
        task = asyncio.create_task(self._watch(label, started))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _watch(self, label: str, started: float) -> None:
        await asyncio.sleep(max(0.0, started + self.after_s - time.time()))
        self.stalls += 1
        for index in range(self.max_dumps):
            at = time.time()
            texts = await asyncio.gather(*(asyncio.to_thread(dump, pid)
                                           for pid in self.pids.values()))
            with self.out.open("a") as out:
                for name, text in zip(self.pids, texts, strict=True):
                    out.write(f"=== {label} dump {index} of {name} at "
                              f"+{(at - started) * 1000:.0f} ms\n{text}\n")
            await asyncio.sleep(self.interval_s)
