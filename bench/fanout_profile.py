"""py-spy on a few agents of the fan-out fleet while one push reaches them.

Each profiled agent's stacks (raw collapsed format, 100 Hz, idle stacks left out by
py-spy) are summed by function: the share of its busy samples in which the function
was on the stack (inclusive), so what one push costs an agent shows by step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.upload_throughput import py_spy, py_spy_binary


@contextlib.contextmanager
def profiled(pids: Sequence[int], out_dir: Path) -> Iterator[list[Path]]:
    """py-spy on every pid while the block runs; the raw outputs."""
    if pids and not py_spy_binary().is_file():
        raise RuntimeError(f"--py-spy needs {py_spy_binary()}: .venv/bin/pip install py-spy")
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = [out_dir / f"agent-{pid}.txt" for pid in pids]
    with contextlib.ExitStack() as stack:
        for pid, output in zip(pids, outputs, strict=True):
            stack.enter_context(py_spy(pid, output))
        yield outputs


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
