"""Python stacks of the benchmarks' processes with py-spy (``pip install py-spy``).

``recording`` samples whole processes while a block runs (raw collapsed stacks, for
"where does the CPU go"), ``inclusive`` sums such files by function, and ``StallDumps``
dumps every thread of the named processes while one operation is slower than a
threshold, again and again until it ends, so a rare tail is caught in the act.
py-spy is not a dependency: the benchmarks ask for it only with ``--py-spy``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


def py_spy_binary() -> Path:
    """The py-spy beside this interpreter."""
    return Path(sys.executable).parent / "py-spy"


def require_py_spy() -> None:
    if not py_spy_binary().is_file():
        raise SystemExit(f"--py-spy needs {py_spy_binary()} (.venv/bin/pip install py-spy)")


@contextlib.contextmanager
def recording(outputs: Mapping[int, Path], *, rate: int = 100,
              idle: bool = True) -> Iterator[None]:
    """``py-spy record`` of each pid into its file (raw collapsed stacks, idle threads
    too unless ``idle`` is False) while the block runs."""
    if outputs:
        require_py_spy()
    for output in outputs.values():
        output.parent.mkdir(parents=True, exist_ok=True)
    spies = [subprocess.Popen([str(py_spy_binary()), "record", "-p", str(pid), "-o",
                               str(output), "--format", "raw", "-r", str(rate), "--threads",
                               "--nonblocking", *(["--idle"] if idle else [])],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for pid, output in outputs.items()]
    time.sleep(1.0)  # attached before the block starts
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


def inclusive(paths: Sequence[Path], top: int = 30) -> dict[str, Any]:
    """Busy samples over every profile, and each function's inclusive share of them."""
    total = 0
    by_function: dict[str, int] = {}
    for path in paths:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            total += count
            for frame in set(stack.split(";")[1:]):  # [0] is the thread
                by_function[frame] = by_function.get(frame, 0) + count
    # Ties by name: the frames of a stack are counted from a set, in no fixed order.
    ranked = sorted(by_function.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return {"agents": len(paths), "samples": total,
            "inclusive_pct": [(name, round(100 * n / max(total, 1), 1)) for name, n in ranked]}


def profile_summary(output: Path, top: int = 25) -> str:
    """The busy samples of a raw py-spy profile and each function's inclusive share."""
    summary = inclusive([output], top=top)
    lines = [f"py-spy of the agent, {summary['samples']} samples; inclusive share by function:"]
    lines += [f"  {share:5.1f}%  {name}" for name, share in summary["inclusive_pct"]]
    return "\n".join(lines)


def dump(pid: int) -> str:
    """One ``py-spy dump`` of every thread of ``pid`` (not paused: ``--nonblocking``)."""
    done = subprocess.run([str(py_spy_binary()), "dump", "--pid", str(pid), "--nonblocking"],
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
