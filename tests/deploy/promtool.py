"""Finding Debian's Prometheus tools, which scripts/ci-tools.sh installs."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"


def tool(name: str) -> str:
    """The path of ``name`` (promtool, prometheus); a missing one fails the test."""
    found = shutil.which(name)
    assert found is not None, (
        f"{name} is not installed: run scripts/ci-tools.sh as root (Debian's `prometheus` "
        "package), as scripts/test.sh does")
    return found
