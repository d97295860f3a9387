"""``./scripts/demo.sh``, the README's first command, runs to its end as written.

It installs what it needs (the venv, vLLM's CPU build when missing), starts a registry,
vLLM and an agent, swaps v1 for v2 under a running stream and stops everything; the
scenario checks itself (scripts/demo_swap.py) and exits non-zero when a step fails.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from devharness.processes import clean_env

ROOT = Path(__file__).resolve().parents[2]
# A cold machine installs vLLM (about 2 minutes) before the demo's 1.5.
TIMEOUT_S = 1200


def test_the_demo_runs_to_its_end(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    done = subprocess.run(["./scripts/demo.sh", "--data-dir", str(run_dir)], cwd=ROOT,
                          env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)
    output = f"stdout:\n{done.stdout[-6000:]}\nstderr:\n{done.stderr[-6000:]}"
    assert done.returncode == 0, output
    assert "v2 first served" in done.stdout, output
    assert "done: everything stopped" in done.stdout, output
