"""A child process with its own process group and log file, as the fleet runs them.

Start processes from the main thread: each child is told to die with the thread that
forked it (so a killed test run leaves nothing behind), and worker threads come and go.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx

from loraplane.embedded_nats import die_with_parent_hook

BIN = Path(sys.executable).parent
LOG_TAIL_LINES = 60
# Settings any LORAPLANE_* variable of the caller could change; only binaries pass.
KEPT_ENV = ("LORAPLANE_NATS_SERVER", "LORAPLANE_WEED", "LORAPLANE_VLLM_VENV")


class FleetError(RuntimeError):
    """A process of the fleet did not start, or exited; the message holds its log tail."""


def loraplane_command() -> list[str]:
    """The installed ``loraplane`` script of this environment, else ``python -m``."""
    script = BIN / "loraplane"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "loraplane.cli"]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without LORAPLANE_* settings that would change what runs."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LORAPLANE_") or k in KEPT_ENV}
    env.update(extra or {})
    return env


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ChildProcess:
    """One command in its own process group, its output appended to ``log_path``."""

    def __init__(self, name: str, argv: Sequence[str], *, env: Mapping[str, str],
                 log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def start(self) -> None:
        if self.running:
            raise FleetError(f"{self.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"\n=== {time.strftime('%H:%M:%S')} start {self.name}\n".encode())
        self._log.flush()
        self._proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env=self.env, start_new_session=True,
            preexec_fn=die_with_parent_hook(),  # noqa: PLW1509 - only a prctl call
        )

    def stop(self, grace_s: float = 20.0, sig: signal.Signals = signal.SIGTERM) -> int | None:
        """Signal the group, wait up to ``grace_s``, then SIGKILL; the exit code (None if
        it was not running). Safe to call twice."""
        proc, self._proc = self._proc, None
        code: int | None = None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                code = proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
            # Children that outlived the leader (vLLM's engine, say) go too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return _tail(self.log_path, lines)

    def wait_http(self, url: str, timeout_s: float, *, ok: Sequence[int] = (200,)) -> float:
        """Poll ``url`` until it answers with a status in ``ok``; seconds waited."""
        started = time.monotonic()
        last = "no answer yet"
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() - started < timeout_s:
                code = self.exit_code()
                if code is not None or self._proc is None:
                    raise FleetError(f"{self.name} exited with {code} before it was ready; "
                                     f"log {self.log_path}:\n{self.tail()}")
                try:
                    response = client.get(url)
                    if response.status_code in ok:
                        return time.monotonic() - started
                    last = f"{response.status_code} {response.text[:300]}"
                except httpx.TransportError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                time.sleep(0.2)
        raise FleetError(f"{self.name} not ready after {timeout_s:.0f}s ({last}); "
                         f"log {self.log_path}:\n{self.tail()}")
