"""A child process: output in a log file, readiness awaited with a deadline, the log's
tail in every failure, and a graceful stop (SIGTERM, then SIGKILL after a grace period).

The registry's embedded NATS runs on it, and so do the development harness's services,
vLLM servers, registries and agents. By default a child is told to die with the thread
that started it (Linux), so a crashed or killed parent leaves nothing holding ports or
stores: start children from a thread that lives as long as they should.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1

# A readiness check: None once the process is ready, else why it is not yet.
Probe = Callable[[], str | None]


class ProcessError(RuntimeError):
    """A child process could not start, exited, or was not ready in time; the message
    holds the end of its log."""


def die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes a child process die with us (Linux only; else None).

    Without it a crashed or SIGKILLed parent leaves, for example, nats-server holding
    the port and the store directory, and the next start fails with "address in use".
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    return hook


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ChildProcess:
    """One command, its output appended to ``log_path``; ``start`` again after ``stop``.

    With ``own_group`` it leads a process group of its own, and ``stop`` reaches every
    process in it (vLLM's engine runs in a child process of the server).
    """

    def __init__(self, name: str, argv: Sequence[str], *, log_path: Path,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None,
                 own_group: bool = False, die_with_parent: bool = True) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.log_path = log_path
        self.own_group = own_group
        self.die_with_parent = die_with_parent
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
            raise ProcessError(f"{self.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"\n=== {time.strftime('%H:%M:%S')} start {self.name}\n".encode())
        self._log.flush()
        try:
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                start_new_session=self.own_group,
                preexec_fn=die_with_parent_hook() if self.die_with_parent else None,  # noqa: PLW1509 - only a prctl call
            )
        except OSError as exc:
            self._close_log()
            raise ProcessError(f"cannot run {self.name} ({self.argv[0]}): {exc}") from exc

    def wait_ready(self, probe: Probe, timeout_s: float, *, interval_s: float = 0.1) -> float:
        """Call ``probe`` until it says ready; the seconds waited. Raises ``ProcessError``
        when the process exits first or ``timeout_s`` passes; exceptions of ``probe``
        pass through."""
        started = time.monotonic()
        while True:
            code = self.exit_code()
            if self._proc is None or code is not None:
                raise ProcessError(f"{self.name} exited with code {code} before it was "
                                   f"ready; log {self.log_path}:\n{self.tail()}")
            reason = probe()
            waited = time.monotonic() - started
            if reason is None:
                return waited
            if waited >= timeout_s:
                raise ProcessError(f"{self.name} not ready after {timeout_s:g}s ({reason}); "
                                   f"log {self.log_path}:\n{self.tail()}")
            time.sleep(interval_s)

    def send_signal(self, sig: signal.Signals) -> None:
        """Signal the process (its whole group, with ``own_group``), if it was started."""
        if self._proc is not None:
            self._signal(self._proc, sig)

    def stop(self, grace_s: float = 20.0, sig: signal.Signals = signal.SIGTERM) -> int | None:
        """Send ``sig``, wait up to ``grace_s``, then SIGKILL; the exit code (None if it
        was not started). Safe to call twice."""
        proc, self._proc = self._proc, None
        try:
            return None if proc is None else self._end(proc, grace_s, sig)
        finally:
            self._close_log()

    def _end(self, proc: subprocess.Popen[bytes], grace_s: float, sig: signal.Signals) -> int:
        deadline = time.monotonic() + grace_s
        self._signal(proc, sig)
        self._signal(proc, signal.SIGCONT)  # a paused process cannot act on SIGTERM
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self._signal(proc, signal.SIGKILL)
        if self.own_group:
            # Children that outlive the leader (vLLM's engine, say) get what is left.
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            self._signal(proc, signal.SIGKILL)
        return proc.wait()

    def _signal(self, proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        if not self.own_group:
            proc.send_signal(sig)  # does nothing once the process is reaped
            return
        with contextlib.suppress(ProcessLookupError):
            # start_new_session makes the leader's pid the group id.
            os.killpg(proc.pid, sig)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
