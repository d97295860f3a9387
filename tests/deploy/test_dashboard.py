"""deploy/grafana/loraplane.json is what deploy/grafana/build.py builds, with the panels
the design asks for. tests/e2e/test_prometheus.py runs its queries on live data."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from deploy.grafana import build
from deploy.grafana.queries import every_expr
from tests.deploy.promtool import ROOT


def committed() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(build.OUTPUT.read_text())
    return loaded


def dashboard_exprs(board: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]


def test_the_committed_dashboard_is_a_fresh_build() -> None:
    assert build.OUTPUT.read_text() == build.render(), (
        "deploy/grafana/loraplane.json is stale: run python -m deploy.grafana.build")


def test_the_build_command_writes_and_checks() -> None:
    result = subprocess.run([sys.executable, "-m", "deploy.grafana.build", "--check"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_the_panels_the_design_asks_for() -> None:
    board = committed()
    assert board["uid"] == build.UID
    titles = {panel["title"] for panel in board["panels"]}
    for wanted in ("Requests per adapter", "Latency p95 per adapter",
                   "Cache hit rate per adapter", "Load time p95 per adapter",
                   "Error ratio per adapter", "Agents serving each alias's version",
                   "Outbox backlog", "Event-loop lag p99", "Canary weight",
                   "Canary against stable"):
        assert wanted in titles, wanted
    assert dashboard_exprs(board) == every_expr()
    # Every panel asks the data source chosen at import, never a fixed one.
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
