"""A 50 MB adapter: push to first served, split into phases, against the physical floor.

One host (``bench/agent_setup.py``) whose vLLM serves a larger random Llama
(``bench/large_model.py``: hidden 512, 20 layers) with ``--max-lora-rank 64``. Each
sample pushes a new rank-64 LoRA over all seven projections (49.97 MB of float32,
a seed of its own) to a hot adapter (``aliases=live``) while one client asks for it
through the agent back to back. The clock starts when the push is *sent*.

Phases, on one wall-clock timeline (the agent's log and ``stage_seconds`` histograms):
``upload + commit`` (push sent -> answered), ``event, to fetch start`` (answered ->
the agent starts the download: the agent logs no mark of its own at an event's
receipt, so the event's delivery is shown beside it from the agent's
``event_delay_seconds``), ``fetch`` (download with its streaming sha256), ``verify +
validate`` (the agent's second sha256 pass, digest, header and NaN/Inf scan), ``load``
(vLLM's ``load_lora_adapter``), ``flip``, ``other`` (bookkeeping until the flip) and
``first response`` (flip -> the first answer from the new version).

The floor, measured right after each push on the same files: a boto3 ``get_object`` of
each of the version's blobs from the registry's SeaweedFS bucket (read to the end, at
loopback speed), plus vLLM's own ``load_lora_adapter`` of the same folder under a fresh
name. The bench's probe client keeps asking for the adapter meanwhile, so the floor
runs under the same traffic as the push. For context also a boto3 ``download_file``
(the same read, written to a file, as the agent must) and a ``put_object`` of the same
bytes (what an upload can not beat). Ratios are per sample, then their percentiles.

    .venv/bin/python -m bench.large_adapter --samples 10
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.agent_setup import (
    BASE_MODEL,
    MachineLoad,
    bench_testbed,
    event_delays,
    flips,
    materialized,
    mean_event_delay,
    parse_sampling,
    sampling_parser,
    stage_totals,
)
from bench.common import git_commit, percentile, record, table
from bench.large_model import (
    LARGE,
    SMALL,
    Shape,
    build_model,
    default_model_dir,
    make_large_adapter,
)
from devharness.openai_client import OpenAIClient
from devharness.testbed import E2E_TENANT, Testbed
from devharness.vllm import ensure_vllm_env
from devharness.waiting import eventually
from loraplane.client import AsyncRegistryClient
from loraplane.digest import sha256_file

NAME = "large"  # the adapter pushed, not agent_setup.ADAPTER: both benches share CI's testbed
SERVED_TIMEOUT_S = 120.0
SEED_BASE = 9000
PHASES = ("upload + commit", "event, to fetch start", "fetch", "verify + validate", "load",
          "flip", "other", "first response")


@dataclass
class Sample:
    """One push and its floor; times are wall clock (``time.time()``), ``*_s`` durations."""

    version: int
    size_bytes: int
    sent: float
    answered: float
    first_response: float
    stages: dict[str, float]
    s3_get_s: float = 0.0
    s3_put_s: float = 0.0
    s3_get_to_disk_s: float = 0.0
    request_s: float = 0.0  # median one-token request while the floor was measured
    vllm_load_s: float = 0.0
    event_delay_s: float | None = None
    materialized: float | None = None
    flipped: float | None = None

    @property
    def total_s(self) -> float:
        return self.first_response - self.sent

    @property
    def floor_s(self) -> float:
        return self.s3_get_s + self.vllm_load_s

    def phases(self) -> dict[str, float] | None:
        if self.materialized is None or self.flipped is None:
            return None
        fetch, validate = self.stages["fetch"], self.stages["validate"]
        load, flip = self.stages["load"], self.stages["flip"]
        fetch_started = self.materialized - fetch - validate
        return {"upload + commit": self.answered - self.sent,
                "event, to fetch start": fetch_started - self.answered,
                "fetch": fetch, "verify + validate": validate, "load": load, "flip": flip,
                "other": self.flipped - self.materialized - load - flip,
                "first response": self.first_response - self.flipped}


async def push_and_wait(api: AsyncRegistryClient, client: OpenAIClient, testbed: Testbed,
                        folder: Path) -> Sample:
    """Push ``folder``; ask for the adapter until its new version answers."""
    agent = testbed.agents["a"]
    text = agent.metrics()
    before, delays_before = stage_totals(text), event_delays(text)
    sent = time.time()
    push = asyncio.create_task(api.push(NAME, folder, aliases=["live"]))
    marks: list[float] = []
    push.add_done_callback(lambda _: marks.append(time.time()))
    while True:
        result = await client.complete(NAME, max_tokens=1)
        if push.done() and result.ok and result.adapter == f"{NAME}@{push.result().version}":
            break
        if time.time() - sent > SERVED_TIMEOUT_S:
            raise RuntimeError(f"{folder.name} not served within {SERVED_TIMEOUT_S}s: {result}")
    first = time.time()
    version = push.result().version
    # The old version's unload ends the swap: the next sample starts from a quiet agent.
    await eventually(lambda: stage_totals(agent.metrics()).minus(before).counts["unload"] >= 1,
                     timeout_s=SERVED_TIMEOUT_S, what="the old version unloaded")
    text = agent.metrics()
    sample = Sample(version, folder_bytes(folder), sent, marks[0], first,
                    stage_totals(text).minus(before).sums)
    sample.event_delay_s = mean_event_delay(delays_before, event_delays(text))
    return sample


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir())


def measure_floor(testbed: Testbed, folder: Path, sample: Sample, index: int) -> None:
    """S3 reads of the version's blobs, a put of the same bytes, vLLM's load of the folder."""
    s3 = testbed.blobs.s3.client()
    try:
        for path in sorted(folder.iterdir()):
            _size, sha = sha256_file(path)
            key = testbed.blobs.key(sha)
            started = time.perf_counter()
            body = s3.get_object(Bucket=testbed.blobs.bucket, Key=key)["Body"]
            while body.read(1 << 20):
                pass
            sample.s3_get_s += time.perf_counter() - started
            # The agent must also write the bytes where vLLM reads them.
            copy = folder.parent / f"floor-{index}-{path.name}"
            started = time.perf_counter()
            s3.download_file(testbed.blobs.bucket, key, str(copy))
            sample.s3_get_to_disk_s += time.perf_counter() - started
            copy.unlink()
            started = time.perf_counter()
            with path.open("rb") as data:
                s3.put_object(Bucket=testbed.blobs.bucket, Key=f"floor/{index}/{path.name}",
                              Body=data)
            sample.s3_put_s += time.perf_counter() - started
    finally:
        s3.close()
    vllm = testbed.vllms["a"].url
    name = f"floor-{index}"
    started = time.perf_counter()
    response = httpx.post(f"{vllm}/v1/load_lora_adapter",
                          json={"lora_name": name, "lora_path": str(folder)}, timeout=120)
    sample.vllm_load_s = time.perf_counter() - started
    response.raise_for_status()
    httpx.post(f"{vllm}/v1/unload_lora_adapter", json={"lora_name": name},
               timeout=60).raise_for_status()


def attach_marks(samples: list[Sample], log_text: str) -> None:
    done = materialized(log_text, NAME)
    flipped = {flip.new: flip.at for flip in flips(log_text, NAME)}
    for sample in samples:
        sample.materialized = done.get(sample.version)
        sample.flipped = flipped.get(sample.version)


async def measure(testbed: Testbed, work: Path, shape: Shape, count: int,
                  warmup: int) -> list[Sample]:
    async with AsyncRegistryClient(testbed.registry.url, testbed.registry.admin_token,
                                   timeout_s=300) as api, \
            OpenAIClient(testbed.agents["a"].url, token=testbed.inference_token) as client:
        await api.create_adapter(NAME, BASE_MODEL, tenant=E2E_TENANT)
        samples: list[Sample] = []
        for index in range(1 + warmup + count):
            folder = make_large_adapter(work / f"push-{index}", seed=SEED_BASE + index,
                                        base_model=BASE_MODEL, shape=shape)
            if index == 0:  # the first version makes the adapter hot
                await api.push(NAME, folder, aliases=["live"])
                await eventually(lambda: first_served(client), timeout_s=SERVED_TIMEOUT_S,
                                 what=f"{NAME}@1 served")
                continue
            sample = await push_and_wait(api, client, testbed, folder)
            # The same probe traffic as during the push: the floor runs on the same load.
            latencies: list[float] = []
            probing = asyncio.create_task(probe(client, latencies))
            try:
                await asyncio.to_thread(measure_floor, testbed, folder, sample, index)
            finally:
                probing.cancel()
                await asyncio.gather(probing, return_exceptions=True)
            sample.request_s = percentile(latencies, 50) if latencies else 0.0
            if index > warmup:
                samples.append(sample)
                print(f"  sample {len(samples)}/{count}: {sample.total_s * 1000:.0f} ms, floor "
                      f"{sample.floor_s * 1000:.0f} ms", file=sys.stderr)
            shutil.rmtree(folder)
    attach_marks(samples, testbed.agents["a"].process.log_text())
    return samples


async def probe(client: OpenAIClient, latencies: list[float]) -> None:
    while True:
        started = time.perf_counter()
        await client.complete(NAME, max_tokens=1)
        latencies.append(time.perf_counter() - started)


async def first_served(client: OpenAIClient) -> bool:
    result = await client.complete(NAME, max_tokens=1)
    return result.ok and result.adapter == f"{NAME}@1"


def row(name: str, values: list[float], scale: float = 1000.0) -> list[str]:
    return [name, *(f"{percentile(values, p) * scale:.1f}" for p in (50, 90)),
            f"{min(values) * scale:.1f}", f"{max(values) * scale:.1f}"]


def summarize(samples: list[Sample]) -> dict[str, Any]:
    split = [p for p in (s.phases() for s in samples) if p is not None]
    rows = [row("push sent -> first response (total)", [s.total_s for s in samples])]
    rows += [row(f"  {phase}", [p[phase] for p in split]) for phase in PHASES]
    delays = [s.event_delay_s for s in samples if s.event_delay_s is not None]
    if delays:
        rows.append(row("  (event commit -> agent, its event_delay_seconds)", delays))
    rows += [row("floor: S3 get (loopback) + vLLM load", [s.floor_s for s in samples]),
             row("  S3 get of the blobs", [s.s3_get_s for s in samples]),
             row("  vLLM load_lora_adapter", [s.vllm_load_s for s in samples]),
             row("(S3 get written to a file, boto3 download_file, for context)",
                 [s.s3_get_to_disk_s for s in samples]),
             row("(S3 put of the same bytes, for context)", [s.s3_put_s for s in samples]),
             row("(one 1-token request meanwhile, median per sample)",
                 [s.request_s for s in samples])]
    ratios = {
        "total / floor": [s.total_s / s.floor_s for s in samples],
        "(push answered -> first response) / floor":
            [(s.first_response - s.answered) / s.floor_s for s in samples],
        "total / (floor + S3 put)": [s.total_s / (s.floor_s + s.s3_put_s) for s in samples],
        "(push answered -> first response) / (floor + one request)":
            [(s.first_response - s.answered) / (s.floor_s + s.request_s) for s in samples],
    }
    rows += [row(f"ratio {name}", values, scale=1.0) for name, values in ratios.items()]
    return {"samples": len(samples), "split": len(split),
            "size_mb": round(samples[0].size_bytes / 1e6, 2), "rows": rows,
            "ratio_p50": {k: round(percentile(v, 50), 2) for k, v in ratios.items()}}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = sampling_parser(__doc__, samples=10, warmup=1, what="pushes")
    parser.add_argument("--small", action="store_true",
                        help="the tiny model's shape instead (a quick check, as in CI)")
    parser.add_argument("--model-dir", type=Path, default=default_model_dir(),
                        help="where the larger Llama is built once and kept "
                             "(default %(default)s)")
    return parse_sampling(parser, argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work = Path(tempfile.mkdtemp(prefix="lp-bench-large-", dir=args.work_dir))
    shape = SMALL if args.small else LARGE
    try:
        # The tiny model is SMALL's shape: bench_testbed builds it when given no model.
        model = None if args.small else build_model(args.model_dir, ensure_vllm_env(), shape)
        commit = git_commit()
        with bench_testbed(work, max_loras=3, max_loaded=3, model_dir=model, max_lora_rank=64,
                           max_model_len=512) as testbed, MachineLoad() as load:
            samples = asyncio.run(measure(testbed, work, shape, args.samples, args.warmup))
        summary = summarize(samples)
        print(table(["", "p50", "p90", "min", "max"], summary["rows"]))
        print(f"ms, except ratios; {summary['samples']} samples of {summary['size_mb']} MB")
        return record("large_adapter", commit, load.summary, args.json_out,
                      shape=asdict(shape), summary=summary,
                      samples=[asdict(s) for s in samples])
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
