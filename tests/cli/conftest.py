"""A real ``loraplane registry serve`` subprocess on the embedded default, and a CLI runner.

The registry runs exactly as an operator would start it: SQLite, local blobs and an
embedded nats-server under a temporary data dir, on free ports. Every CLI call is a
subprocess too, reading the admin token from that data dir.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from loraplane.netutil import free_ports
from loraplane.process import ChildProcess, ProcessError

CLI = (sys.executable, "-m", "loraplane_cli")
# The CLI with SIGINT handled as in a terminal's foreground job, for tests that send it:
# a suite started in the background (`./scripts/test.sh &` in a script) inherits SIGINT
# ignored, Python keeps it ignored, and the child would never see the test's Ctrl-C.
RESTORE_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)"
RUN_CLI = "import runpy; runpy.run_module('loraplane_cli', run_name='__main__')"
INTERRUPTIBLE_CLI = (sys.executable, "-c", f"{RESTORE_SIGINT}\n{RUN_CLI}")
START_TIMEOUT_S = 90.0
CALL_TIMEOUT_S = 120.0
# The nats-server binary may be named explicitly on some machines; nothing else leaks in.
KEPT_ENV = ("LORAPLANE_NATS_SERVER",)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without LORAPLANE_* settings or a saved login that would change
    what is tested."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LORAPLANE_") or k in KEPT_ENV}
    env.pop("COLUMNS", None)
    # No profile of the machine's `loraplane login` either (an empty config file).
    env["LORAPLANE_CONFIG"] = os.devnull
    env.update(extra)
    return env


@dataclass
class Result:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def __str__(self) -> str:
        return (f"loraplane {' '.join(self.args)} -> {self.returncode}\n"
                f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}")


@dataclass
class ServedRegistry:
    url: str
    data_dir: Path
    log_path: Path
    process: ChildProcess

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(**{"LORAPLANE_REGISTRY": self.url,
                            "LORAPLANE_DATA_DIR": str(self.data_dir), **extra})

    def run(self, *args: str, expect: int | None = 0, **env: str) -> Result:
        """``loraplane ARGS`` against this registry; fails the test on another exit code."""
        done = subprocess.run([*CLI, *args], capture_output=True, text=True,
                              timeout=CALL_TIMEOUT_S, env=self.env(**env), check=False)
        result = Result(args, done.returncode, done.stdout, done.stderr)
        if expect is not None:
            assert result.returncode == expect, str(result)
        assert "Traceback" not in result.stderr, str(result)
        return result

    def get(self, url: str) -> Any:
        token = (self.data_dir / "admin-token").read_text().strip()
        response = httpx.get(self.url + url, headers={"Authorization": f"Bearer {token}"})
        response.raise_for_status()
        return response.json()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _wait_ready(served: ServedRegistry) -> str | None:
    """None once the registry answers and its admin token exists; else why it never did."""

    def probe() -> str | None:
        try:
            status = httpx.get(served.url + "/readyz", timeout=2).status_code
        except httpx.TransportError as exc:
            return f"{type(exc).__name__}: {exc}"
        if status != 200:
            return f"/readyz answered {status}"
        return None if (served.data_dir / "admin-token").exists() else "no admin token yet"

    try:
        served.process.wait_ready(probe, START_TIMEOUT_S, interval_s=0.2)
    except ProcessError as exc:
        return str(exc)
    return None


def _stop(process: ChildProcess) -> int | None:
    """Ctrl-C, as an operator would; a registry that ignores it is killed."""
    return process.stop(30, signal.SIGINT)


def start_registry(root: Path, attempt: int) -> tuple[ServedRegistry, str | None]:
    port, nats_port = free_ports(2)
    data_dir = root / f"data-{attempt}"
    log_path = root / f"serve-{attempt}.log"
    process = ChildProcess(
        "loraplane registry serve",
        [*CLI, "registry", "serve", "--port", str(port), "--data-dir", str(data_dir)],
        log_path=log_path, env=clean_env(LORAPLANE_EMBEDDED_NATS_PORT=str(nats_port)))
    process.start()
    served = ServedRegistry(f"http://127.0.0.1:{port}", data_dir, log_path, process)
    return served, _wait_ready(served)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedRegistry]:
    root = tmp_path_factory.mktemp("cli-e2e")
    failure: str | None = "never started"
    for attempt in range(3):
        registry, failure = start_registry(root, attempt)
        if failure is None:
            break
        _stop(registry.process)
        # A free port can be taken between choosing it and binding it: try new ones.
        if "address already in use" not in registry.log():
            pytest.fail(f"loraplane registry serve {failure}:\n{registry.log()}", pytrace=False)
    else:
        pytest.fail(f"loraplane registry serve {failure}:\n{registry.log()}", pytrace=False)
    try:
        yield registry
    finally:
        code = _stop(registry.process)
        assert code == 0, f"registry serve exited with {code} on Ctrl-C:\n{registry.log()}"
