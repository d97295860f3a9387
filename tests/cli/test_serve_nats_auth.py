"""A real ``loraplane registry serve`` on a password-protected NATS: it connects, and
neither its banner nor its log (at debug level) shows the password."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import httpx

from loraplane.netutil import free_port
from loraplane.process import ChildProcess, ProcessError
from tests.cli.conftest import clean_env
from tests.core.nats_auth_support import secured_nats

PASSWORD = "pa55-word-never-logged"


def test_serve_connects_with_a_password_and_never_prints_it(tmp_path: Path) -> None:
    config = f'authorization {{\n  user: registry\n  password: "{PASSWORD}"\n}}\n'
    with secured_nats(tmp_path / "nats", config) as nats_url:
        port = free_port()
        log_path = tmp_path / "serve.log"
        process = ChildProcess(
            "loraplane registry serve",
            [sys.executable, "-m", "loraplane_cli", "registry", "serve", "--port", str(port),
             "--data-dir", str(tmp_path / "data"), "--log-level", "debug",
             "--nats-url", nats_url, "--nats-user", "registry"],
            log_path=log_path, env=clean_env(LORAPLANE_NATS_PASSWORD=PASSWORD))
        process.start()

        def connected() -> str | None:
            try:
                httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
            except httpx.TransportError as exc:
                return str(exc)
            text = log_path.read_text(errors="replace")
            return None if "connected to NATS at" in text else "not connected to NATS yet"

        try:
            process.wait_ready(connected, 90, interval_s=0.2)
        except ProcessError as exc:
            raise AssertionError(str(exc)) from None
        finally:
            process.stop(30, signal.SIGINT)
    output = log_path.read_text(errors="replace")
    assert f"{nats_url} (user registry)" in output
    assert PASSWORD not in output
