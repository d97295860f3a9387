"""Routing hit rate: llm-d's LoRA affinity scoring against random picks, two real agents.

Two hosts, each a CPU vLLM (the tiny model, ``--max-loras``) with a ``loraplane agent``
(``--max-loaded``) in front of it, one registry. For each workload (a number of adapters
and a Zipf exponent, 0 for uniform) one seeded stream of requests is sent one at a time,
first to agents chosen at random, then, over adapters of their own, to the agent
devharness/llmd_picker.py picks from both agents' ``/metrics/model-server`` with
llm-d's scorers and the weights of deploy/kubernetes/epp.yaml (LoRA affinity 3, queue 1,
KV cache 1; ties at random). Before the picker's run, the random run's adapters are
deleted and their slots freed.

A hit is a request whose adapter was already loaded on the agent that got it, as that
agent's cache counted it (``loraplane_agent_cache_hits_total`` against ``_misses_``);
the client's own prediction from the scrape is printed beside it. The run records the
commit it measured. ``tests/e2e/test_routing.py`` runs the same code, smaller, in CI.

    .venv/bin/python -m bench.routing_hit_rate --workload 5:0 --workload 8:0 \\
        --workload 8:1 --workload 16:1 --requests 300
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.agent_setup import BASE_MODEL, MachineLoad, bench_testbed
from bench.common import git_commit, record, table
from devharness.llmd_picker import Comparison, Setup, compare
from devharness.testbed import E2E_TENANT, Testbed
from loraplane.client import AsyncRegistryClient

HOSTS = ("a", "b")


def workload(text: str) -> tuple[int, float]:
    """``ADAPTERS:ZIPF``, e.g. ``8:1.0``."""
    adapters, _, zipf = text.partition(":")
    try:
        parsed = int(adapters), float(zipf or 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ADAPTERS:ZIPF") from None
    if parsed[0] < 1 or parsed[1] < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: adapters >= 1, zipf >= 0")
    return parsed


async def measure(testbed: Testbed, args: argparse.Namespace) -> list[Comparison]:
    agents = {agent.agent_id: agent.url for agent in testbed.agents.values()}
    results: list[Comparison] = []
    async with AsyncRegistryClient(testbed.registry.url, testbed.registry.admin_token,
                                   timeout_s=120) as api:
        setup = Setup(api=api, agents=agents, inference_token=testbed.inference_token,
                      adapter_dir=testbed.adapter_dir("a1"), base_model=BASE_MODEL,
                      tenant=E2E_TENANT, slots=args.max_loaded * len(agents))
        for adapters, zipf_s in args.workload:
            prefix = f"hit-{secrets.token_hex(3)}"
            result = await compare(setup, prefix, adapters=adapters, requests=args.requests,
                                   zipf_s=zipf_s, seed=args.seed)
            print(f"{adapters} adapters, zipf {zipf_s}: llm-d {result.by_picker.hit_rate:.3f}"
                  f", random {result.at_random.hit_rate:.3f}", file=sys.stderr)
            results.append(result)
    return results


def rows(results: list[Comparison]) -> list[dict[str, Any]]:
    return [{"adapters": r.adapters, "zipf_s": r.zipf_s, "requests": r.requests,
             "distinct": r.distinct, "llmd": r.by_picker.summary(),
             "random": r.at_random.summary()} for r in results]


def render(results: list[Comparison]) -> str:
    body = [[r.adapters, r.zipf_s, r.requests, f"{r.by_picker.hit_rate:.3f}",
             f"{r.at_random.hit_rate:.3f}", r.by_picker.agent_misses, r.at_random.agent_misses,
             r.by_picker.hot_elsewhere, r.at_random.hot_elsewhere,
             " / ".join(str(n) for _a, n in sorted(r.by_picker.per_agent.items()))]
            for r in results]
    return table(["adapters", "zipf", "requests", "llm-d hit rate", "random hit rate",
                  "llm-d misses", "random misses", "llm-d sent where cold, hot elsewhere",
                  "random: same", "llm-d requests per agent"], body)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workload", type=workload, action="append", default=None,
                        help="ADAPTERS:ZIPF, repeatable (default 5:0, 8:0, 8:1)")
    parser.add_argument("--requests", type=int, default=300, help="per policy (300)")
    parser.add_argument("--max-loaded", type=int, default=3,
                        help="each agent's --max-loaded and vLLM's --max-loras (3)")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.workload = args.workload or [(5, 0.0), (8, 0.0), (8, 1.0)]
    if args.requests < 1 or args.max_loaded < 1:
        parser.error("--requests and --max-loaded must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    measured = git_commit()
    work = Path(tempfile.mkdtemp(prefix="lp-bench-routing-", dir=args.work_dir))
    try:
        with contextlib.ExitStack() as stack:
            testbed = stack.enter_context(bench_testbed(
                work, max_loras=args.max_loaded, max_loaded=args.max_loaded, hosts=HOSTS))
            with MachineLoad() as load:
                results = asyncio.run(measure(testbed, args))
        print(render(results))
        record("routing_hit_rate", measured, load.summary, args.json_out,
               args={k: str(v) for k, v in vars(args).items()}, rows=rows(results))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
