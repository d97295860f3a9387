"""A real Prometheus server (Debian's `prometheus`, from scripts/ci-tools.sh) for tests:
it scrapes given targets every second, loads given rule files, and answers PromQL.

    with PrometheusServer(work, {"registry": ["127.0.0.1:8080"]}, rules=[alerts]) as prom:
        await prom.query("up")
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from devharness.processes import http_probe
from loraplane.netutil import free_port
from loraplane.process import ChildProcess, ProcessError

SCRAPE_INTERVAL = "1s"


class PrometheusError(ProcessError):
    pass


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise PrometheusError("prometheus is not installed: run scripts/ci-tools.sh as root "
                              "(Debian's `prometheus` package)")
    return found


def config(targets: Mapping[str, Sequence[str]], rules: Sequence[Path]) -> dict[str, Any]:
    """A configuration scraping ``targets`` (job -> host:port list) at /metrics."""
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL,
                   "scrape_timeout": SCRAPE_INTERVAL},
        "rule_files": [str(path) for path in rules],
        "scrape_configs": [{"job_name": job, "metrics_path": "/metrics",
                            "static_configs": [{"targets": list(hosts)}]}
                           for job, hosts in targets.items()],
    }


class PrometheusServer:
    """One Prometheus on a free port, its data in ``work_dir``; stopped on exit."""

    def __init__(self, work_dir: Path, targets: Mapping[str, Sequence[str]], *,
                 rules: Sequence[Path] = ()) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config_file = work_dir / "prometheus.yml"
        # JSON is YAML: no YAML writer needed.
        config_file.write_text(json.dumps(config(targets, rules), indent=2))
        self.process = ChildProcess("prometheus", [
            prometheus_binary(), f"--config.file={config_file}",
            f"--storage.tsdb.path={work_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
        ], log_path=work_dir / "prometheus.log")
        self.http = httpx.AsyncClient(base_url=self.url, timeout=30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        self.process.start()
        self.process.wait_ready(http_probe(f"{self.url}/-/ready"), timeout_s, interval_s=0.2)

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one item) ``expr`` gives now; raises on a
        query Prometheus refuses."""
        response = await self.http.get("/api/v1/query", params={"query": expr})
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(f"query {expr!r} failed: {response.status_code} {body}")
        data = body["data"]
        result: list[dict[str, Any]] = (data["result"] if data["resultType"] == "vector"
                                        else [{"value": data["result"]}])
        return result

    async def rules(self) -> list[dict[str, Any]]:
        response = await self.http.get("/api/v1/rules")
        response.raise_for_status()
        return [rule for group in response.json()["data"]["groups"] for rule in group["rules"]]

    async def targets(self) -> list[dict[str, Any]]:
        response = await self.http.get("/api/v1/targets")
        response.raise_for_status()
        active: list[dict[str, Any]] = response.json()["data"]["activeTargets"]
        return active

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.process.stop(grace_s=10)

    async def aclose(self) -> None:
        await self.http.aclose()
