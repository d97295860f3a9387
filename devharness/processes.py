"""How the harness runs loraplane's own commands as processes (``loraplane.process``).

Start processes from the main thread: each child is told to die with the thread that
forked it (so a killed test run leaves nothing behind), and worker threads come and go.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from loraplane.process import Probe

BIN = Path(sys.executable).parent
# Settings any LORAPLANE_* variable of the caller could change; only binaries pass.
KEPT_ENV = ("LORAPLANE_NATS_SERVER", "LORAPLANE_WEED", "LORAPLANE_VLLM_VENV")


def loraplane_command() -> list[str]:
    """The installed ``loraplane`` script of this environment, else ``python -m``."""
    script = BIN / "loraplane"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "loraplane_cli"]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without LORAPLANE_* settings that would change what runs."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LORAPLANE_") or k in KEPT_ENV}
    env.update(extra or {})
    return env


def http_probe(url: str, *, ok: Sequence[int] = (200,)) -> Probe:
    """A readiness probe for ``ChildProcess.wait_ready``: ready once ``url`` answers
    with a status in ``ok``."""

    def probe() -> str | None:
        try:
            response = httpx.get(url, timeout=5.0)
        except httpx.TransportError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if response.status_code in ok else \
            f"{response.status_code} {response.text[:300]}"

    return probe
