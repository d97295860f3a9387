"""Many adapters over few slots: a seeded Zipf stream, the agent against vLLM's own LRU.

``--adapters`` adapters (50) share ``--slots`` LoRA slots (4) of one CPU vLLM with the
tiny model. The same seeded stream of ``--requests`` streamed completions (Zipf,
``--zipf-s`` 1.0) is sent by ``--concurrency`` closed-loop clients, in rounds that
alternate between:

- **vLLM alone**: every adapter registered up front with ``/v1/load_lora_adapter``, so
  vLLM's own LRU over ``--max-loras`` (and ``--max-cpu-loras``, the same 4 by default)
  decides what stays loaded, reading an evicted adapter from disk again at its next
  request;
- **the agent**: ``loraplane agent --watch-dir`` with the adapters as folders,
  ``--max-loaded`` = the slots; a cold adapter is loaded at its first request, the least
  recently used idle one unloaded to make room.

Each round starts cold (the adapters are registered under new names, or a new agent
starts), on the same vLLM. Time to first token is split into hits and misses of an
ideal LRU of ``--slots`` over the send order, the same yardstick for both; the agent's
own counters say how many requests waited on a load, how many loads and evictions it
made. Ratios are agent / vLLM alone within the run.

    .venv/bin/python -m bench.zipf_adapters
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.proxy_stats import commit_line
from bench.proxy_variants import CommitAgentProcess, archive
from bench.zipf_traffic import Sent, lru_hits, send_stream, ttft_summary, zipf_stream
from devharness.openai_client import limits
from devharness.testbed import AgentProcess, AgentSpec
from devharness.vllm import (
    DEFAULT_BASE_MODEL_NAME,
    VllmServer,
    ensure_tiny_model,
    ensure_vllm_env,
)
from devharness.waiting import eventually
from loraplane.client.multipart import ADAPTER_FILES

TOKEN = "lp_bench-zipf"
SOURCES = ("a1", "a2", "a3", "a4", "a5")
AGENT_COUNTERS = {"hits": "loraplane_agent_cache_hits",
                  "waited_on_load": "loraplane_agent_cache_misses",
                  "evictions": "loraplane_agent_cache_evictions",
                  "loads": "loraplane_agent_adapter_load_seconds"}
STAGE_TOTALS = ("load_sum", "load_count", "unload_sum", "unload_count")


def adapter_folders(model_dir: Path, out: Path, count: int) -> list[Path]:
    """``count`` adapter folders ``zipf-NN`` (the tiny model's a1..a5, in turn)."""
    folders = []
    for index in range(count):
        folder = out / f"zipf-{index:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        source = model_dir / "adapters" / SOURCES[index % len(SOURCES)]
        for name in ADAPTER_FILES:
            shutil.copyfile(source / name, folder / name)
        folders.append(folder)
    return folders


def agent_counters(metrics_text: str) -> dict[str, float]:
    """The agent's cache counters, summed over adapters, and the seconds (and count) of
    its calls to vLLM's load and unload."""
    totals = dict.fromkeys([*AGENT_COUNTERS, *STAGE_TOTALS], 0.0)
    wanted = {f"{family}_total": key for key, family in AGENT_COUNTERS.items()}
    wanted["loraplane_agent_adapter_load_seconds_count"] = "loads"
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                totals[key] += sample.value
            elif sample.name.startswith("loraplane_agent_stage_seconds_"):
                stage = f"{sample.labels.get('stage')}_{sample.name.rpartition('_')[2]}"
                if stage in totals:
                    totals[stage] += sample.value
    return totals


def _per_minute(count: float, seconds: float) -> float:
    return round(count * 60 / seconds, 1) if seconds > 0 else 0.0


async def vllm_round(vllm_url: str, folders: list[Path], stream: list[int],
                     args: argparse.Namespace, tag: str) -> dict[str, Any]:
    """Every adapter registered with vLLM under a new name, then the stream."""
    names = [f"zb{tag}-{i:02d}" for i in range(len(folders))]
    async with httpx.AsyncClient(base_url=vllm_url, timeout=60.0, limits=limits()) as http:
        for name, folder in zip(names, folders, strict=True):
            response = await http.post("/v1/load_lora_adapter",
                                       json={"lora_name": name, "lora_path": str(folder)})
            response.raise_for_status()
        try:
            results, seconds = await send_stream(
                vllm_url, [names[i] for i in stream], concurrency=args.concurrency,
                max_tokens=args.max_tokens)
        finally:
            for name in names:
                await http.post("/v1/unload_lora_adapter", json={"lora_name": name})
    return {"results": results, "seconds": seconds}


@contextlib.contextmanager
def running_agent(work: Path, vllm_url: str, watch: Path, slots: int, tag: str,
                  source: tuple[str, Path] | None = None) -> Iterator[AgentProcess]:
    """This checkout's agent, or with ``source`` (commit, folder) that commit's."""
    keys = work / "keys"
    keys.write_text(f"local {hashlib.sha256(TOKEN.encode()).hexdigest()}\n")
    spec = AgentSpec(agent_id=f"zipf-{tag}", vllm_url=vllm_url,
                     base_model=DEFAULT_BASE_MODEL_NAME, cache_dir=work / f"cache-{tag}",
                     max_loaded=slots, watch_dir=watch,
                     settings={"keys_file": str(keys), "resync_interval_s": "3600",
                               "log_level": "warning"})
    agent = (AgentProcess(spec, work) if source is None
             else CommitAgentProcess(spec, work, source[1], source[0]))
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()
        # A stopped agent leaves its versions in vLLM; the next round starts cold.
        unload_all(vllm_url)


def unload_all(vllm_url: str) -> None:
    models = httpx.get(f"{vllm_url}/v1/models", timeout=30.0).json()["data"]
    for name in (m["id"] for m in models if m.get("parent") is not None):
        httpx.post(f"{vllm_url}/v1/unload_lora_adapter", json={"lora_name": name},
                   timeout=30.0)


async def _routed(url: str, count: int) -> None:
    async def listed() -> bool:
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as http:
            response = await http.get("/v1/models",
                                      headers={"Authorization": f"Bearer {TOKEN}"})
            response.raise_for_status()
            ids = {str(m["id"]) for m in response.json()["data"]}
        return sum(i.startswith("zipf-") and "@" not in i for i in ids) >= count

    await eventually(listed, timeout_s=120, retrying=(httpx.HTTPError,),
                     what=f"the agent routing all {count} watched adapters")


async def agent_round(work: Path, vllm_url: str, watch: Path, stream: list[int],
                      args: argparse.Namespace, tag: str,
                      source: tuple[str, Path] | None = None) -> dict[str, Any]:
    """A new agent on the adapters' folders, then the stream through it."""
    with running_agent(work, vllm_url, watch, args.slots, tag, source) as agent:
        await _routed(agent.url, args.adapters)
        before = agent_counters(agent.metrics())
        results, seconds = await send_stream(
            agent.url, [f"zipf-{i:02d}" for i in stream], concurrency=args.concurrency,
            max_tokens=args.max_tokens, headers={"Authorization": f"Bearer {TOKEN}"})
        after = agent_counters(agent.metrics())
    counters = {k: after[k] - before[k] for k in after}
    return {"results": results, "seconds": seconds, "counters": counters}


def _summary(rounds: list[dict[str, Any]], hits: list[bool]) -> dict[str, Any]:
    """Percentiles over every request of every round; rates per round."""
    shift = len(hits)
    pooled: list[Sent] = []
    for number, round_ in enumerate(rounds):
        pooled += [Sent(r.index + number * shift, r.ttft_s, r.total_s, r.error)
                   for r in round_["results"]]
    seconds = sum(r["seconds"] for r in rounds)
    misses = hits.count(False) * len(rounds)
    out: dict[str, Any] = {"ttft": ttft_summary(pooled, hits * len(rounds)),
                           "seconds": round(seconds, 1),
                           "requests_per_s": round(len(pooled) / seconds, 2),
                           "lru_misses_per_minute": _per_minute(misses, seconds)}
    if "counters" in rounds[0]:
        counters = {k: sum(r["counters"][k] for r in rounds) for k in rounds[0]["counters"]}
        requests = counters["hits"] + counters["waited_on_load"]
        calls = {f"{stage}_call_ms_mean": round(
            1000 * counters.pop(f"{stage}_sum") / max(1.0, counters.pop(f"{stage}_count")), 1)
            for stage in ("load", "unload")}
        out["agent"] = {**{k: int(v) for k, v in counters.items()}, **calls,
                        "hit_rate": round(counters["hits"] / requests, 3) if requests else 0,
                        "loads_per_minute": _per_minute(counters["loads"], seconds),
                        "evictions_per_minute": _per_minute(counters["evictions"], seconds)}
    return out


def _ratios(agent: dict[str, Any], vllm: dict[str, Any]) -> dict[str, float]:
    ratios = {}
    for kind in ("all", "hits", "misses"):
        for pct in ("p50_ms", "p99_ms"):
            mine, theirs = agent["ttft"][kind].get(pct), vllm["ttft"][kind].get(pct)
            if mine is not None and theirs:
                ratios[f"ttft_{kind}_{pct.removesuffix('_ms')}"] = round(mine / theirs, 2)
    ratios["requests_per_s"] = round(agent["requests_per_s"] / vllm["requests_per_s"], 2)
    return ratios


async def measure(args: argparse.Namespace, work: Path, vllm_url: str,
                  model_dir: Path) -> dict[str, Any]:
    """Alternating rounds on the vLLM at ``vllm_url`` (``--max-loras`` = ``--slots``)."""
    from bench.agent_setup import MachineLoad  # noqa: PLC0415
    from bench.common import git_commit  # noqa: PLC0415

    measured = git_commit()
    watch = work / "watch"
    folders = adapter_folders(model_dir, watch, args.adapters)
    stream = zipf_stream(args.adapters, args.requests, s=args.zipf_s, seed=args.seed)
    hits = lru_hits(stream, args.slots)
    sources: dict[str, tuple[str, Path] | None] = {"agent": None}
    if args.also_commit is not None:
        commit, folder = archive(args.also_commit, work / "also")
        sources[f"agent@{commit[:10]}"] = (commit, folder)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in ("vllm", *sources)}
    with MachineLoad() as load:
        for number in range(args.rounds):
            # Each system goes first in turn: none always follows the same one.
            order = list(rounds)[number % len(rounds):] + list(rounds)[:number % len(rounds)]
            for system in order:
                tag = f"{number}-{len(rounds[system])}-{system.replace('@', '-')}"
                if system == "vllm":
                    done = await vllm_round(vllm_url, folders, stream, args, tag)
                else:
                    done = await agent_round(work, vllm_url, watch, stream, args, tag,
                                             sources[system])
                rounds[system].append(done)
    summaries = {name: _summary(done, hits) for name, done in rounds.items()}
    return {"benchmark": "zipf_adapters", "commit": measured, "machine": load.summary,
            "settings": {k: v for k, v in vars(args).items()
                         if k not in ("json_out", "model_dir")},
            "distinct_adapters_in_stream": len(set(stream)),
            "lru_hit_rate": round(hits.count(True) / len(hits), 3),
            **summaries, **{f"ratio_{name}_to_vllm": _ratios(summaries[name], summaries["vllm"])
                            for name in sources}}


@contextlib.contextmanager
def own_vllm(work: Path, slots: int) -> Iterator[tuple[str, Path]]:
    python = ensure_vllm_env()
    model = ensure_tiny_model(work / "tiny", python)
    with VllmServer(python, model / "base", work / "vllm.log", max_loras=slots) as server:
        server.wait_ready(timeout=400)
        yield server.url, model


def _print(result: dict[str, Any]) -> None:
    for system in [k for k in result if k == "vllm" or k.startswith("agent")]:
        summary = result[system]
        ttft = summary["ttft"]
        print(f"{system}: {summary['requests_per_s']} req/s; TTFT ms p50/p99: "
              + "; ".join(f"{k} {v.get('p50_ms')}/{v.get('p99_ms')} (n={v['n']})"
                          for k, v in ttft.items() if isinstance(v, dict))
              + f"; failures {ttft['failures']}")
        if "agent" in summary:
            print(f"  agent counters: {summary['agent']}")
    print(f"ideal-LRU hit rate {result['lru_hit_rate']}")
    for key, ratios in result.items():
        if key.startswith("ratio_"):
            name = key.removeprefix("ratio_").removesuffix("_to_vllm")
            print(f"{name} / vLLM alone: {ratios}")
    print(commit_line(result))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--adapters", type=int, default=50)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--requests", type=int, default=600, help="per round (600)")
    p.add_argument("--rounds", type=int, default=4, help="per system, alternating (4)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--zipf-s", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=10)
    p.add_argument("--vllm-url", default=None,
                   help="a running vLLM with --max-loras = --slots (default: start one)")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="the tiny model's folder (with --vllm-url)")
    p.add_argument("--also-commit", default=None, metavar="REV",
                   help="also measure the agent of commit REV, in the same rounds")
    p.add_argument("--json-out", type=Path, default=None)
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from bench.common import write_json  # noqa: PLC0415

    p = parser()
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if min(args.adapters, args.slots, args.requests, args.rounds, args.concurrency) < 1:
        p.error("--adapters, --slots, --requests, --rounds, --concurrency must be positive")
    if (args.vllm_url is None) != (args.model_dir is None):
        p.error("give --vllm-url and --model-dir together")
    with tempfile.TemporaryDirectory(prefix="lp-bench-zipf-") as tmp, \
            contextlib.ExitStack() as stack:
        work = Path(tmp)
        if args.vllm_url is None:
            url, model = stack.enter_context(own_vllm(work, args.slots))
        else:
            url, model = args.vllm_url, args.model_dir
        result = asyncio.run(measure(args, work, url, model))
    _print(result)
    write_json(result, args.json_out)
    return result


if __name__ == "__main__":
    main()
