"""Swaps under load: 20 concurrent streams on one adapter, swapped every second.

One host (``bench/agent_setup.py``): Postgres + SeaweedFS + NATS, ``loraplane registry
serve``, one CPU vLLM with the tiny model (``--max-loras 5``), one ``loraplane agent``
(``--max-loaded 5``). The tiny model's adapters ``a1``..``a5`` are published as versions
1..5 of ``bench``; then ``live`` is moved to the next of them (cycling) every
``--interval`` seconds for ``--duration`` seconds, while ``--streams`` clients each
stream completions (greedy, ``--max-tokens`` tokens, one of four prompts) back to back.

Reference outputs come first: every version and prompt streamed on vLLM directly under
a name of its own. A control phase (``--control`` seconds, no swaps) checks that the
references hold under the same concurrency.

Counted, and both must be 0:

- **failed**: a transport error, a status other than 200, an error event in the stream,
  no ``X-Loraplane-Adapter`` header, or a stream not ending with ``finish_reason=length``;
- **wrong version**: a stream whose header names a version other than the one the
  agent's route pointed at when the request was sent, or one it flipped to before the
  response headers arrived. The agent's flips come from its swap log lines (written in
  the same event-loop step as the flip; whole milliseconds, so a flip within 1 ms of a
  send counts either way); plus **wrong text**: a stream whose text differs from the
  reference of the version its header names (mixed or mislabelled weights).

Also shown: how the agent's flips follow the registry's moves, and how many streams
ran across a flip (their version drained while they finished).

    .venv/bin/python -m bench.agent_swaps_under_load --duration 120
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.agent_setup import (
    ADAPTER,
    BASE_MODEL,
    Flip,
    MachineLoad,
    bench_testbed,
    by_label,
    flips,
    log_lines,
    stage_totals,
    wait_served,
)
from bench.common import percentile
from devharness.openai_client import OpenAIClient
from devharness.testbed import Testbed, metric
from loraplane.client import AsyncRegistryClient

PROMPTS = ("The registry publishes", "An adapter version is", "Every request holds",
           "The agent follows the stream")
VERSIONS = ("a1", "a2", "a3", "a4", "a5")  # published as versions 1..5
LOG_RESOLUTION_S = 0.001
# time.time() minus time.monotonic(): turns a Completion's monotonic stamps into wall time.
_WALL_OFFSET = time.time() - time.monotonic()


@dataclass
class Stream:
    worker: int
    prompt: str
    sent: float
    headers_at: float | None = None
    ended: float | None = None
    status: int | None = None
    adapter: str | None = None
    text: str = ""
    error: str | None = None
    finish_reason: str | None = None
    chunks: int = 0

    @property
    def version(self) -> int | None:
        if self.adapter is None or not self.adapter.startswith(f"{ADAPTER}@"):
            return None
        tail = self.adapter.partition("@")[2]
        return int(tail) if tail.isdigit() else None

    @property
    def failed(self) -> bool:
        return (self.error is not None or self.status != 200 or self.version is None
                or self.finish_reason != "length")


@dataclass
class Move:
    version: int
    sent: float
    answered: float


async def one_stream(client: OpenAIClient, worker: int, prompt: str,
                     max_tokens: int) -> Stream:
    record = Stream(worker, prompt, time.time())
    try:
        result = await client.stream(ADAPTER, prompt=prompt, max_tokens=max_tokens)
    except httpx.HTTPError as exc:
        record.error, record.ended = f"{type(exc).__name__}: {exc}", time.time()
        return record
    record.headers_at = result.started + _WALL_OFFSET
    record.ended = (result.ended or time.monotonic()) + _WALL_OFFSET
    record.status, record.adapter, record.text = result.status, result.adapter, result.text
    record.finish_reason, record.chunks = result.finish_reason, result.chunks
    if result.error is not None:
        record.error = json.dumps(result.error)
    return record


async def stream_load(client: OpenAIClient, streams: int, seconds: float,
                      max_tokens: int) -> list[Stream]:
    """``streams`` closed loops for ``seconds``; streams started by then run to the end."""
    deadline = time.monotonic() + seconds
    done: list[Stream] = []

    async def loop(worker: int) -> None:
        turn = worker
        while time.monotonic() < deadline:
            done.append(await one_stream(client, worker, PROMPTS[turn % len(PROMPTS)],
                                         max_tokens))
            turn += 1

    await asyncio.gather(*(loop(i) for i in range(streams)))
    return done


async def move_every(api: AsyncRegistryClient, interval_s: float, seconds: float) -> list[Move]:
    """Move ``live`` to the next version every ``interval_s`` (on a fixed schedule)."""
    moves: list[Move] = []
    start = time.monotonic()
    step = 1
    while step * interval_s <= seconds:
        await asyncio.sleep(max(0.0, start + step * interval_s - time.monotonic()))
        version = step % len(VERSIONS) + 1  # live starts at 1: 2, 3, 4, 5, 1, 2...
        sent = time.time()
        await api.move_alias(ADAPTER, "live", version)
        moves.append(Move(version, sent, time.time()))
        step += 1
    return moves


async def references(vllm: OpenAIClient, folders: list[Path],
                     max_tokens: int) -> dict[int, dict[str, str]]:
    """version -> prompt -> the text vLLM streams for it alone, loaded under its own name."""
    refs: dict[int, dict[str, str]] = {}
    for version, folder in enumerate(folders, start=1):
        name = f"ref-{secrets.token_hex(4)}"
        loaded = await vllm.http.post("/v1/load_lora_adapter",
                                      json={"lora_name": name, "lora_path": str(folder)})
        loaded.raise_for_status()
        try:
            refs[version] = {}
            for prompt in PROMPTS:
                result = await vllm.stream(name, prompt=prompt, max_tokens=max_tokens)
                if not result.ok:
                    raise RuntimeError(f"reference for v{version}: {result}")
                refs[version][prompt] = result.text
        finally:
            (await vllm.http.post("/v1/unload_lora_adapter",
                                  json={"lora_name": name})).raise_for_status()
    return refs


def allowed_versions(stream: Stream, flip_list: list[Flip]) -> set[int]:
    """The versions the route pointed at between the send and the response headers."""
    current: int | None = None
    allowed: set[int] = set()
    end = stream.headers_at if stream.headers_at is not None else stream.ended or stream.sent
    for flip in flip_list:  # in log order, which is flip order
        if flip.at + LOG_RESOLUTION_S <= stream.sent:
            current = flip.new  # certainly before the send
        elif flip.at < end and flip.new is not None:
            allowed.add(flip.new)  # maybe after the send, certainly before the headers
    if current is not None:
        allowed.add(current)
    return allowed


def classify(streams: list[Stream], flip_list: list[Flip],
             refs: dict[int, dict[str, str]]) -> dict[str, Any]:
    failed = [s for s in streams if s.failed]
    wrong_version, wrong_text, across_flip = [], [], 0
    for stream in streams:
        version = stream.version
        if stream.failed or version is None:
            continue
        if version not in allowed_versions(stream, flip_list):
            wrong_version.append(stream)
        if stream.text != refs[version][stream.prompt]:
            wrong_text.append(stream)
        if any(stream.sent < f.at < (stream.ended or 0) and f.old == version
               for f in flip_list):
            across_flip += 1
    return {"streams": len(streams), "failed": len(failed),
            "wrong_version": len(wrong_version), "wrong_text": len(wrong_text),
            "streams_across_a_flip": across_flip,
            "examples": [asdict(s) for s in (failed + wrong_version + wrong_text)[:5]]}


def _assign(moves: list[Move], flip_list: list[Flip]) -> dict[int, Flip]:
    """move index -> the flip that applied it: the last move to that version sent before
    the flip (the same version comes back only every len(VERSIONS) moves)."""
    applied: dict[int, Flip] = {}
    for flip in flip_list:
        index = max((i for i, m in enumerate(moves)
                     if m.version == flip.new and m.sent < flip.at), default=None)
        if index is not None:
            applied.setdefault(index, flip)
    return applied


def follow_check(moves: list[Move], flip_list: list[Flip]) -> dict[str, Any]:
    """Did the agent's flips follow the registry's moves, in order? A move the agent had
    not started on when the next one landed is skipped: it reads the latest state."""
    applied = _assign(moves, flip_list)
    order = [index for index, _flip in sorted(applied.items(), key=lambda kv: kv[1].at)]
    skipped = [i for i in range(len(moves)) if i not in applied]
    lags = [flip.at - moves[i].answered for i, flip in applied.items()]
    requests = [m.answered - m.sent for m in moves]
    # How soon the next move came after a skipped one (bunched moves are skipped).
    gaps = [moves[i + 1].answered - moves[i].answered for i in skipped if i + 1 < len(moves)]
    return {"moves": len(moves), "flips": len(flip_list), "moves_applied": len(applied),
            "moves_skipped": len(skipped),
            "flips_matched_to_moves": len(applied) == len(flip_list),
            "flips_in_move_order": order == sorted(order),
            "last_flip_is_last_move": bool(flip_list) and flip_list[-1].new == moves[-1].version,
            "move_answered_to_flip_ms": _spread_ms(lags),
            "move_request_ms": _spread_ms(requests),
            "skipped_move_to_next_move_ms": _spread_ms(gaps)}


def _spread_ms(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"p50": round(percentile(values, 50) * 1000, 1),
            "p99": round(percentile(values, 99) * 1000, 1),
            "max": round(max(values) * 1000, 1)}


def _median_ms(values: list[float]) -> float | None:
    return round(percentile(values, 50) * 1000, 1) if values else None


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of swaps")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between moves")
    parser.add_argument("--streams", type=int, default=20, help="concurrent streams")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per stream")
    parser.add_argument("--control", type=float, default=15.0,
                        help="seconds of streams without swaps first (0: none)")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.interval <= 0 or args.streams < 1 or args.max_tokens < 1:
        parser.error("--duration, --interval, --streams and --max-tokens must be positive")
    return args


async def prepare(api: AsyncRegistryClient, testbed: Testbed, folders: list[Path],
                  max_tokens: int) -> dict[int, dict[str, str]]:
    """Publish a1..a5 as versions 1..5 (``live`` on 1); their reference outputs."""
    await api.create_adapter(ADAPTER, BASE_MODEL, tenant="e2e")
    await api.push(ADAPTER, folders[0], aliases=["live"])
    for folder in folders[1:]:
        await api.push(ADAPTER, folder, aliases=())
    async with OpenAIClient(testbed.vllms["a"].url) as vllm:
        return await references(vllm, folders, max_tokens)


def counters(text: str) -> dict[str, float]:
    names = {"swaps_applied": ("loraplane_agent_swaps_total", {"outcome": "applied"}),
             "swaps_stale": ("loraplane_agent_swaps_total", {"outcome": "stale"}),
             "swaps_failed": ("loraplane_agent_swaps_total", {"outcome": "failed"}),
             "requests": ("loraplane_agent_requests_total", {}),
             "request_errors": ("loraplane_agent_request_errors_total", {}),
             "version_failures": ("loraplane_agent_failures_total", {})}
    values = {key: metric(text, name, **labels) for key, (name, labels) in names.items()}
    errors = by_label(text, "loraplane_agent_request_errors_total", "reason")
    values.update({f"request_errors[{reason}]": count for reason, count in errors.items()})
    stages = stage_totals(text)
    for stage in ("load", "drain", "unload"):
        values[f"{stage}_count"] = stages.counts[stage]
        values[f"{stage}_seconds"] = stages.sums[stage]
    return values


async def measure(testbed: Testbed, args: argparse.Namespace) -> dict[str, Any]:
    agent = testbed.agents["a"]
    folders = [testbed.adapter_dir(name) for name in VERSIONS]
    async with AsyncRegistryClient(testbed.registry.url, testbed.registry.admin_token,
                                   timeout_s=120) as api, \
            OpenAIClient(agent.url, token=testbed.inference_token) as client:
        refs = await prepare(api, testbed, folders, args.max_tokens)
        await wait_served(client, ADAPTER, f"{ADAPTER}@1", 60.0)
        control = (await stream_load(client, args.streams, args.control, args.max_tokens)
                   if args.control > 0 else [])
        print(f"  control: {len(control)} streams", file=sys.stderr)
        before = counters(agent.metrics())
        load = asyncio.create_task(stream_load(client, args.streams, args.duration,
                                               args.max_tokens))
        moves = await move_every(api, args.interval, args.duration)
        streams = await load
        await asyncio.sleep(2.0)  # the last drains end
        after = counters(agent.metrics())
        before.update({k: 0.0 for k in after if k not in before})
    log_text = agent.process.log_text()
    flip_list = flips(log_text, ADAPTER)
    distinct = {p: len({refs[v][p] for v in refs}) for p in PROMPTS}
    return {"control": classify(control, flip_list, refs),
            "swaps": classify(streams, flip_list, refs),
            "follow": follow_check(moves, [f for f in flip_list if f.at >= moves[0].sent]),
            "agent_counters": {k: after[k] - before[k] for k in after},
            "distinct_reference_texts_per_prompt": distinct,
            "stream_seconds_p50": _median_ms([(s.ended or s.sent) - s.sent for s in streams]),
            "agent_warnings": log_lines(log_text, " WARNING ", " ERROR ")[:20]}


def render(result: dict[str, Any]) -> str:
    lines = []
    for phase in ("control", "swaps"):
        r = result[phase]
        lines.append(f"{phase:8s} streams {r['streams']:5d}  failed {r['failed']}  "
                     f"wrong version {r['wrong_version']}  wrong text {r['wrong_text']}  "
                     f"across a flip {r['streams_across_a_flip']}")
    lines.append(f"follow: {result['follow']}")
    lines.append(f"agent counters during the swaps: {result['agent_counters']}")
    lines.append(f"distinct reference texts per prompt (of {len(VERSIONS)}): "
                 f"{result['distinct_reference_texts_per_prompt']}; stream p50 "
                 f"{result['stream_seconds_p50']} ms")
    lines.append(f"agent warnings/errors: {len(result['agent_warnings'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work = Path(tempfile.mkdtemp(prefix="lp-bench-swaps-", dir=args.work_dir))
    try:
        with bench_testbed(work, max_loras=len(VERSIONS), max_loaded=len(VERSIONS)) as testbed, \
                MachineLoad() as machine:
            result = asyncio.run(measure(testbed, args))
        print(render(result))
        print(f"machine: {machine.summary}")
        document = {"benchmark": "agent_swaps_under_load", "machine": machine.summary,
                    "settings": {k: str(v) for k, v in vars(args).items()}, **result}
        text = json.dumps(document, indent=2)
        if args.json_out is not None:
            args.json_out.write_text(text + "\n")
        else:
            print(text)
        if result["swaps"]["failed"] or result["swaps"]["wrong_version"] or \
                result["swaps"]["wrong_text"]:
            sys.exit(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
