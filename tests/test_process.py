"""``loraplane.process.ChildProcess``: readiness, the log tail in failures, and the stop."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from loraplane.process import ChildProcess, ProcessError


def python(code: str, log_path: Path, *, own_group: bool = False) -> ChildProcess:
    return ChildProcess("child", [sys.executable, "-c", code], log_path=log_path,
                        own_group=own_group)


def test_an_exit_before_ready_names_the_code_and_shows_the_log(tmp_path: Path) -> None:
    child = python("print('bad flag', flush=True); raise SystemExit(3)", tmp_path / "c.log")
    with child, pytest.raises(ProcessError, match=r"(?s)exited with code 3 .*bad flag"):
        child.wait_ready(lambda: "never", timeout_s=60)


def test_not_ready_in_time_says_why(tmp_path: Path) -> None:
    with python("import time; time.sleep(60)", tmp_path / "c.log") as child, \
            pytest.raises(ProcessError, match=r"not ready after 0.1s \(no answer\)"):
        child.wait_ready(lambda: "no answer", timeout_s=0.1)


@pytest.mark.parametrize("own_group", [False, True])
def test_stop_kills_what_ignores_sigterm(tmp_path: Path, own_group: bool) -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")
    child = python(code, tmp_path / "c.log", own_group=own_group)
    child.start()
    child.wait_ready(lambda: None if "ready" in child.log_text() else "starting", 60)
    assert child.stop(grace_s=0.2) == -signal.SIGKILL
    assert not child.running and child.stop() is None


def test_a_graceful_stop_gives_the_exit_code(tmp_path: Path) -> None:
    with python("import time; time.sleep(60)", tmp_path / "c.log") as child:
        assert child.running
        assert child.stop() == -signal.SIGTERM
