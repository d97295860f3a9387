"""Validation must stream: peak memory stays flat however large the adapter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from devharness.adapters import ALL_MODULES, make_adapter, make_base_config

REPO = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter so the peak it reports belongs to this one
# validation. It reads the peak from VmHWM: getrusage's ru_maxrss survives
# fork+exec on Linux and would start at the pytest process's own peak, which
# could hide a whole-file read.
_PROBE = """
import json, sys
from pathlib import Path
from typing import Any
from loraplane.lora import BaseModelShapes, validate_adapter_dir

def peak() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

adapter, base, mode = sys.argv[1:4]
shapes = BaseModelShapes.from_hf_config(base)
before = peak()
if mode == "validate":
    summary = validate_adapter_dir(adapter, max_rank=32, base_shapes=shapes)
    assert summary.num_tensors == 448, summary
else:
    data = (Path(adapter) / "adapter_model.safetensors").read_bytes()
print(json.dumps({"before": before, "after": peak()}))
"""


def _peak_delta(adapter: Path, base: Path, mode: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(adapter), str(base), mode],
        capture_output=True, text=True, check=True, env=env, cwd=REPO, timeout=120,
    )  # fmt: skip
    sizes = json.loads(result.stdout)
    return int(sizes["after"] - sizes["before"])


def test_validating_a_300_mb_adapter_keeps_memory_flat(tmp_path: Path) -> None:
    shape: dict[str, Any] = {
        "hidden": 4096,
        "intermediate": 11008,
        "layers": 32,
        "heads": 32,
        "kv_heads": 32,
    }
    adapter = make_adapter(tmp_path / "big", rank=32, targets=ALL_MODULES, **shape)
    base = make_base_config(tmp_path / "config.json", **shape)
    size = (adapter / "adapter_model.safetensors").stat().st_size
    assert size > 300_000_000

    # Control: the probe does see a process that reads the file whole.
    assert _peak_delta(adapter, base, "read_all") > size * 0.9
    delta = _peak_delta(adapter, base, "validate")
    assert delta < 40 * 1024 * 1024, (
        f"peak RSS grew by {delta / 2**20:.1f} MiB for a {size / 2**20:.0f} MiB file"
    )
