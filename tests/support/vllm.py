"""Run the real vLLM OpenAI server (CPU build) as a subprocess for tests.

vLLM lives in its own venv (see scripts/vllm/install.sh), so it is always started as a
separate process with that venv's python, exactly as in production.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO_ROOT / "scripts" / "vllm" / "install.sh"
BUILD_SCRIPT = REPO_ROOT / "scripts" / "vllm" / "build_tiny_model.py"
# Written by install.sh only after a complete, import-checked install.
INSTALL_MARKER = ".loraplane-vllm-complete"
DEFAULT_BASE_MODEL_NAME = "tiny-llama"


class VllmEnvError(RuntimeError):
    """The vLLM venv or the tiny model is missing or could not be made."""


class VllmServerError(RuntimeError):
    """The vLLM server exited or did not become ready; the message holds its log tail."""


def vllm_venv_dir() -> Path:
    return Path(os.environ.get("LORAPLANE_VLLM_VENV", REPO_ROOT / ".venv-vllm"))


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _run_logged(cmd: Sequence[str], what: str, timeout: float) -> None:
    """Run cmd to completion; on failure raise with the end of its output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CI": os.environ.get("CI", "true")}
    try:
        result = subprocess.run(
            list(cmd),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise VllmEnvError(f"{what} did not finish within {timeout:.0f}s: {cmd}") from exc
    if result.returncode != 0:
        output = _tail(result.stdout + result.stderr, 40)
        raise VllmEnvError(f"{what} failed (exit {result.returncode}): {cmd}\n{output}")


def ensure_vllm_env(install: bool = False, timeout: float = 1800.0) -> Path:
    """Return the vLLM venv's python.

    With install=True, run scripts/vllm/install.sh first (it is idempotent and returns
    in seconds when the venv is already complete). Without it, a missing venv is an
    error that says how to create one.
    """
    venv = vllm_venv_dir()
    python = venv / "bin" / "python"
    if install:
        _run_logged(["bash", str(INSTALL_SCRIPT)], "scripts/vllm/install.sh", timeout)
    if not (python.exists() and (venv / INSTALL_MARKER).exists()):
        raise VllmEnvError(
            f"no complete vLLM venv at {venv}. Create it with `bash {INSTALL_SCRIPT}` "
            "(about 2 minutes, 3.4 GB; set LORAPLANE_VLLM_VENV to put it elsewhere)."
        )
    return python


def ensure_tiny_model(
    out_dir: Path,
    python: Path | None = None,
    base_model_name: str = DEFAULT_BASE_MODEL_NAME,
    timeout: float = 600.0,
) -> Path:
    """Build (or reuse) the tiny Llama and its test adapters in out_dir; return out_dir.

    Layout: out_dir/base, out_dir/adapters/<name>, out_dir/manifest.json.
    """
    python = python or ensure_vllm_env()
    cmd = [str(python), str(BUILD_SCRIPT), str(out_dir), "--base-model-name", base_model_name]
    _run_logged(cmd, "build_tiny_model.py", timeout)
    return out_dir


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class VllmServer:
    """One `vllm.entrypoints.openai.api_server` process in its own process group."""

    def __init__(
        self,
        python: Path,
        model_dir: Path,
        log_path: Path,
        *,
        served_model_name: str = DEFAULT_BASE_MODEL_NAME,
        max_loras: int = 4,
        max_lora_rank: int = 16,
        port: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.python = python
        self.model_dir = model_dir
        self.log_path = log_path
        self.served_model_name = served_model_name
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.port = port or free_port()
        self.extra_args = tuple(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        return [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_model_name,
            "--enable-lora",
            "--max-loras", str(self.max_loras),
            "--max-lora-rank", str(self.max_lora_rank),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--dtype", "float32",
            "--max-model-len", "256",
            "--enforce-eager",
            *self.extra_args,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The project's venv settings must not leak into vLLM's interpreter.
        for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
            env.pop(name, None)
        env.update(
            HF_HUB_OFFLINE="1",
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            VLLM_CPU_KVCACHE_SPACE="1",
            # Usage reporting would try the network, which tests never reach.
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            TOKENIZERS_PARALLELISM="false",
        )
        return env

    def start(self) -> None:
        if self._proc is not None:
            raise VllmServerError("server already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            # Own group: stop() must also reach the EngineCore child process.
            start_new_session=True,
        )

    def log_tail(self, lines: int = 60) -> str:
        try:
            return _tail(self.log_path.read_text(errors="replace"), lines)
        except OSError:
            return "<no log>"

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait_ready(self, timeout: float = 240.0) -> float:
        """Poll GET /v1/models until it answers 200; return seconds waited."""
        if self._proc is None:
            raise VllmServerError("server not started")
        started = time.monotonic()
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() - started < timeout:
                code = self._proc.poll()
                if code is not None:
                    raise VllmServerError(
                        f"vLLM exited with {code} before it was ready; log {self.log_path}:\n"
                        f"{self.log_tail()}"
                    )
                try:
                    if client.get(f"{self.url}/v1/models").status_code == 200:
                        return time.monotonic() - started
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
        raise VllmServerError(
            f"vLLM not ready after {timeout:.0f}s; log {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the whole process group, then SIGKILL whatever is left after grace."""
        proc, self._proc = self._proc, None
        if proc is not None:
            pgid = proc.pid  # start_new_session makes the leader's pid the group id
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.2)
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
