"""The push of a tiny adapter alone: no vLLM, no agent, no probe traffic on the machine.

What ``bench/agent_publish_to_served.py`` calls the push request, measured with nothing
else running: a registry (``loraplane registry serve``) on a fresh Postgres database,
SeaweedFS and a ``nats-server``, each a process of its own, and a client doing what
``loraplane push`` does (``get_adapter``, then the upload with ``aliases=live``), one push
after another, each new content of the publish benchmark's size. ``--busy K`` runs K
CPU busy loops beside it (processes at niceness 0), to tell a busy CPU from a crowded
one: vLLM's CPU engine spins on one core.

    .venv/bin/python -m bench.push_alone --pushes 150 --busy 0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.agent_setup import BASE_MODEL, MachineLoad
from bench.common import git_commit, percentile, record, registry_alone, table
from devharness.adapters import ATTENTION_MODULES, make_adapter
from devharness.testbed import E2E_TENANT
from loraplane.client import AsyncRegistryClient

ADAPTER = "alone"
SEED_BASE = 7000


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPU until the block ends."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


async def push_all(url: str, token: str, folders: list[Path]) -> list[float]:
    """Seconds of each push, the client's ``get_adapter`` included."""
    times = []
    async with AsyncRegistryClient(url, token, timeout_s=120) as api:
        await api.create_adapter(ADAPTER, BASE_MODEL, tenant=E2E_TENANT)
        for folder in folders:
            started = time.perf_counter()
            await api.push(ADAPTER, folder, aliases=["live"])
            times.append(time.perf_counter() - started)
    return times


def measure(work: Path, pushes: int, warmup: int, busy: int) -> tuple[list[float], Any]:
    folders = [make_adapter(work / f"push-{i:03d}", rank=8, alpha=16,
                            targets=ATTENTION_MODULES, base_model=BASE_MODEL,
                            seed=SEED_BASE + i) for i in range(warmup + pushes)]
    with contextlib.ExitStack() as stack:
        registry = registry_alone(stack, work, "push-alone")
        with busy_loops(busy), MachineLoad() as load:
            times = asyncio.run(push_all(registry.url, registry.admin_token, folders))
    return times[warmup:], load.summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=150, help="measured pushes (150)")
    parser.add_argument("--warmup", type=int, default=10, help="pushes not counted (10)")
    parser.add_argument("--busy", type=int, default=0, help="CPU busy loops beside (0)")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.pushes < 1 or args.warmup < 0 or args.busy < 0:
        parser.error("--pushes must be positive, --warmup and --busy not negative")
    commit = git_commit()
    with tempfile.TemporaryDirectory(prefix="lp-bench-push-", dir=args.work_dir) as work:
        times, machine = measure(Path(work), args.pushes, args.warmup, args.busy)
    cells = {f"p{p}": round(percentile(times, p) * 1000, 1) for p in (50, 90, 99)}
    cells["max"] = round(max(times) * 1000, 1)
    print(table(["busy loops", "pushes", *cells], [[args.busy, len(times), *cells.values()]]))
    return record("push_alone", commit, machine, args.json_out, busy_loops=args.busy,
                  push_ms=cells, samples_ms=[round(t * 1000, 2) for t in times])


if __name__ == "__main__":
    main()
