"""loraplane against vLLM alone: its ``lora_filesystem_resolver``, measured in one run.

vLLM's own way to serve a new adapter without a restart is the filesystem resolver
(``VLLM_PLUGINS=lora_filesystem_resolver``, ``VLLM_LORA_RESOLVER_CACHE_DIR=DIR``,
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): copy a PEFT folder into ``DIR`` and the
first request naming the folder loads it (vLLM 0.32,
``vllm/plugins/lora_resolvers/filesystem_resolver.py``; the folder's
``base_model_name_or_path`` must equal ``--model``). A name is resolved once and kept,
so a new version needs a new folder name, and its clients must be told the new name.

One testbed (``bench/agent_setup.py``) whose one CPU vLLM also has the resolver on, so
both sides use the same server, interleaved sample by sample:

- **publish -> served.** loraplane: push a new version of a hot adapter (``aliases=live``;
  clock from the push being *sent*) while one client asks the adapter's name through
  the agent back to back, until the new version answers. Resolver: copy the folder into
  ``DIR`` (clock from the copy's start), then one request naming it, straight to vLLM.
- **cold first request.** loraplane: a new adapter is pushed and the agent has it on disk
  (its ``materialized`` log line), not loaded; clock one request through the agent.
  Resolver: the folder is in ``DIR`` and was never asked for; clock one request to vLLM.
  The next request to each (warm) is timed too, for reference.

Every adapter is a rank-8 q/k/v/o LoRA of the tiny Llama with a seed of its own
(``devharness/adapters.py: make_adapter``). Prerequisites as for the other agent
benchmarks, plus the vLLM venv (``bash scripts/vllm/install.sh``).

    .venv/bin/python -m bench.vllm_resolver --samples 40
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.agent_setup import (
    ADAPTER,
    BASE_MODEL,
    MachineLoad,
    bench_testbed,
    materialized,
    parse_sampling,
    sampling_parser,
)
from bench.common import git_commit, percentile, record, table
from devharness.adapters import ATTENTION_MODULES, make_adapter
from devharness.openai_client import Completion, OpenAIClient
from devharness.testbed import E2E_TENANT, Testbed
from devharness.waiting import eventually
from loraplane.client import AsyncRegistryClient

SERVED_TIMEOUT_S = 60.0
SEED_BASE = 7000
KINDS = ("publish", "cold", "warm")


class BenchFailure(RuntimeError):
    """A request the benchmark relies on did not succeed."""


@dataclass
class Samples:
    """Seconds per kind and side (``loraplane`` / ``resolver``), plus split parts."""

    times: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: {k: {"loraplane": [], "resolver": []} for k in KINDS})
    parts: dict[str, list[float]] = field(default_factory=dict)
    probes: int = 0

    def add(self, kind: str, side: str, seconds: float) -> None:
        self.times[kind][side].append(seconds)

    def part(self, name: str, seconds: float) -> None:
        self.parts.setdefault(name, []).append(seconds)


@dataclass
class Sides:
    """What both sides need: the API, clients to the agent and to vLLM, the folders."""

    testbed: Testbed
    api: AsyncRegistryClient
    agent: OpenAIClient
    vllm: OpenAIClient
    sources: Path
    resolver_dir: Path


def folder(sides: Sides, name: str, seed: int, base_model: str) -> Path:
    return make_adapter(sides.sources / name, rank=8, alpha=16, targets=ATTENTION_MODULES,
                        base_model=base_model, seed=seed)


def expect(result: Completion, what: str) -> Completion:
    if not result.ok:
        raise BenchFailure(f"{what}: {result}")
    return result


async def timed(call: Callable[[], Awaitable[Completion]], what: str) -> float:
    started = time.perf_counter()
    expect(await call(), what)
    return time.perf_counter() - started


async def loraplane_publish(sides: Sides, index: int, samples: Samples) -> None:
    source = folder(sides, f"lp-{index}", SEED_BASE + index, BASE_MODEL)
    sent = time.perf_counter()
    push = asyncio.create_task(sides.api.push(ADAPTER, source, aliases=["live"]))
    marks: list[float] = []
    push.add_done_callback(lambda _: marks.append(time.perf_counter()))
    while True:
        result = await sides.agent.complete(ADAPTER, max_tokens=1)
        samples.probes += 1
        if push.done() and result.ok and result.adapter == f"{ADAPTER}@{push.result().version}":
            break
        if time.perf_counter() - sent > SERVED_TIMEOUT_S:
            raise BenchFailure(f"{ADAPTER} push {index} not served: last {result}")
    done = time.perf_counter()
    samples.add("publish", "loraplane", done - sent)
    samples.part("loraplane: push sent -> answered (upload, commit)", marks[0] - sent)
    samples.part("loraplane: push answered -> first response", done - marks[0])


async def resolver_publish(sides: Sides, index: int, samples: Samples) -> None:
    name = f"res-{index}"
    source = folder(sides, name, SEED_BASE + index, str(sides.testbed.base_dir))
    started = time.perf_counter()
    await asyncio.to_thread(shutil.copytree, source, sides.resolver_dir / name)
    copied = time.perf_counter()
    await timed(lambda: sides.vllm.complete(name, max_tokens=1), f"resolver {name}")
    done = time.perf_counter()
    samples.add("publish", "resolver", done - started)
    samples.part("resolver: copy into its directory", copied - started)
    samples.part("resolver: first request (resolve, load, answer)", done - copied)


async def loraplane_cold(sides: Sides, index: int, samples: Samples) -> None:
    name = f"cold-{index}"
    await sides.api.create_adapter(name, BASE_MODEL, tenant=E2E_TENANT)
    await sides.api.push(name, folder(sides, name, SEED_BASE + 5000 + index, BASE_MODEL),
                         aliases=["live"])
    agent = sides.testbed.agents["a"]
    await eventually(lambda: 1 in materialized(agent.process.log_text(), name),
                     timeout_s=SERVED_TIMEOUT_S, what=f"{name}@1 on the agent's disk")
    call = lambda: sides.agent.complete(name, max_tokens=1)  # noqa: E731
    samples.add("cold", "loraplane", await timed(call, f"cold {name}"))
    samples.add("warm", "loraplane", await timed(call, f"warm {name}"))


async def resolver_cold(sides: Sides, index: int, samples: Samples) -> None:
    name = f"rcold-{index}"
    source = folder(sides, name, SEED_BASE + 5000 + index, str(sides.testbed.base_dir))
    await asyncio.to_thread(shutil.copytree, source, sides.resolver_dir / name)
    call = lambda: sides.vllm.complete(name, max_tokens=1)  # noqa: E731
    samples.add("cold", "resolver", await timed(call, f"cold {name}"))
    samples.add("warm", "resolver", await timed(call, f"warm {name}"))


async def measure(sides: Sides, count: int, warmup: int) -> Samples:
    await sides.api.create_adapter(ADAPTER, BASE_MODEL, tenant=E2E_TENANT)
    await sides.api.push(ADAPTER, folder(sides, "lp-first", SEED_BASE - 1, BASE_MODEL),
                         aliases=["live"])
    await eventually(lambda: served(sides, f"{ADAPTER}@1"), timeout_s=SERVED_TIMEOUT_S,
                     what=f"{ADAPTER}@1 served")
    samples = Samples()
    for index in range(-warmup, count):
        into = samples if index >= 0 else Samples()
        # Alternate which side goes first, so neither always follows the other's load.
        steps = [loraplane_publish, resolver_publish, loraplane_cold, resolver_cold]
        for step in steps if index % 2 == 0 else steps[::-1]:
            await step(sides, index + warmup, into)
        if index >= 0:
            print(f"  sample {index + 1}/{count}", file=sys.stderr)
    return samples


async def served(sides: Sides, name: str) -> bool:
    result = await sides.agent.complete(ADAPTER, max_tokens=1)
    return result.ok and result.adapter == name


def ms(values: list[float], pct: float) -> str:
    return f"{percentile(values, pct) * 1000:.1f}"


def summarize(samples: Samples) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for kind in KINDS:
        ours, theirs = samples.times[kind]["loraplane"], samples.times[kind]["resolver"]
        rows[kind] = {
            "n": len(ours),
            **{f"loraplane_p{p}_ms": float(ms(ours, p)) for p in (50, 90)},
            **{f"resolver_p{p}_ms": float(ms(theirs, p)) for p in (50, 90)},
            **{f"ratio_p{p}": round(percentile(ours, p) / percentile(theirs, p), 2)
               for p in (50, 90)},
            "loraplane_max_ms": float(ms(ours, 100)), "resolver_max_ms": float(ms(theirs, 100))}
    parts = {name: {"p50_ms": float(ms(v, 50)), "p90_ms": float(ms(v, 90)), "n": len(v)}
             for name, v in samples.parts.items()}
    return {"kinds": rows, "parts": parts, "probe_requests": samples.probes}


def render(summary: dict[str, Any]) -> str:
    names = {"publish": "published -> first served", "cold": "first request, not loaded",
             "warm": "next request (warm, reference)"}
    rows = [[names[k], r["n"], r["loraplane_p50_ms"], r["resolver_p50_ms"], r["ratio_p50"],
             r["loraplane_p90_ms"], r["resolver_p90_ms"], r["ratio_p90"]]
            for k, r in summary["kinds"].items()]
    main = table(["measure", "n", "loraplane p50 ms", "resolver p50 ms", "ratio p50",
                  "loraplane p90 ms", "resolver p90 ms", "ratio p90"], rows)
    split = table(["part", "p50 ms", "p90 ms"],
                  [[n, p["p50_ms"], p["p90_ms"]] for n, p in summary["parts"].items()])
    return f"{main}\n\n{split}"


@contextlib.asynccontextmanager
async def sides_of(testbed: Testbed, work: Path, resolver_dir: Path):  # type: ignore[no-untyped-def]
    async with AsyncRegistryClient(testbed.registry.url, testbed.registry.admin_token,
                                   timeout_s=120) as api, \
            OpenAIClient(testbed.agents["a"].url, token=testbed.inference_token) as agent, \
            OpenAIClient(testbed.vllms["a"].url) as vllm:
        yield Sides(testbed, api, agent, vllm, work / "sources", resolver_dir)


async def run(testbed: Testbed, work: Path, resolver_dir: Path, count: int,
              warmup: int) -> Samples:
    async with sides_of(testbed, work, resolver_dir) as sides:
        return await measure(sides, count, warmup)


def resolver_env(resolver_dir: Path) -> dict[str, str]:
    """What turns vLLM's filesystem resolver on (VLLM_ALLOW_RUNTIME_LORA_UPDATING is on
    in every vLLM the harness starts)."""
    return {"VLLM_PLUGINS": "lora_filesystem_resolver",
            "VLLM_LORA_RESOLVER_CACHE_DIR": str(resolver_dir)}


def parse_args(argv: list[str]) -> argparse.Namespace:
    # A round is one sample of each kind on each side.
    parser = sampling_parser(__doc__, samples=40, warmup=2, what="rounds")
    return parse_sampling(parser, argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work = Path(tempfile.mkdtemp(prefix="lp-bench-resolver-", dir=args.work_dir))
    try:
        resolver_dir = work / "resolver"
        resolver_dir.mkdir()
        commit = git_commit()
        with bench_testbed(work, max_loras=4, max_loaded=3,
                           vllm_env=resolver_env(resolver_dir)) as testbed, \
                MachineLoad() as load:
            samples = asyncio.run(run(testbed, work, resolver_dir, args.samples, args.warmup))
        summary = summarize(samples)
        print(render(summary))
        return record("vllm_resolver", commit, load.summary, args.json_out,
                      summary=summary, samples=samples.times)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
