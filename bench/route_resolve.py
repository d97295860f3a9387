"""What resolving one request's model costs the proxy as a tenant's adapters grow.

Every proxied request that names an adapter is resolved by ``RouteTable.resolve``
(``inference_agent/serving/routes.py``). A route table is filled with ``--adapters``
adapters of one tenant, each with a ``live`` alias, and the bench times ``resolve``
of one of them by name, by alias and by version, in this process (no I/O): CPU
microseconds per call, the median of ``--rounds`` rounds of ``--calls`` calls.

    .venv/bin/python -m bench.route_resolve --adapters 1 100 500 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.agent_setup import MachineLoad
from bench.common import git_commit, record, table
from inference_agent.serving.routes import RouteTable
from loraplane.events import VersionRef

BASE = "base"
TENANT = "acme"
MODELS = ("a{mid}", "a{mid}@live", "a{mid}@1")


def filled(count: int) -> RouteTable:
    routes = RouteTable(BASE)
    for number in range(count):
        adapter = f"a{number:05d}"
        routes.set_owner(adapter, TENANT)
        ref = VersionRef(adapter=adapter, version=1, digest="0" * 64, base_model=BASE,
                         rank=8, alpha=16, target_modules=["q_proj"], files=[])
        routes.set_alias(adapter, "live", 1, ref)
    return routes


def per_call_us(routes: RouteTable, model: str, calls: int) -> float:
    headers: dict[str, str] = {}
    started = time.process_time()
    for _ in range(calls):
        routes.resolve(model, headers, TENANT)
    return (time.process_time() - started) / calls * 1e6


def measure(counts: list[int], calls: int, rounds: int) -> dict[str, dict[str, float]]:
    found: dict[str, dict[str, float]] = {}
    for count in counts:
        routes = filled(count)
        middle = f"{count // 2:05d}"
        found[str(count)] = {
            form.format(mid="N"): round(statistics.median(
                per_call_us(routes, form.format(mid=middle), calls) for _ in range(rounds)), 2)
            for form in MODELS}
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 100, 500, 1000])
    parser.add_argument("--calls", type=int, default=20000, help="per round (20000)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if min(*args.adapters, args.calls, args.rounds) < 1:
        parser.error("--adapters, --calls and --rounds must be positive")
    commit = git_commit()
    with MachineLoad() as load:
        found = measure(args.adapters, args.calls, args.rounds)
    forms = [form.format(mid="N") for form in MODELS]
    print(table(["adapters", *(f"{form} µs" for form in forms)],
                [[count, *(values[form] for form in forms)] for count, values in found.items()]))
    return record("route_resolve", commit, load.summary, args.json_out,
                  calls=args.calls, rounds=args.rounds, us_per_resolve=found)


if __name__ == "__main__":
    main()
