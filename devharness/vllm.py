"""Run the real vLLM OpenAI server (CPU build) as a subprocess for tests.

vLLM lives in its own venv (see scripts/vllm/install.sh), so it is always started as a
separate process with that venv's python, exactly as in production.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from loraplane.netutil import free_port
from loraplane.process import ChildProcess, ProcessError, log_tail

REPO_ROOT = Path(__file__).resolve().parents[1]
INSTALL_SCRIPT = REPO_ROOT / "scripts" / "vllm" / "install.sh"
BUILD_SCRIPT = REPO_ROOT / "scripts" / "vllm" / "build_tiny_model.py"
# Written by install.sh only after a complete, import-checked install.
INSTALL_MARKER = ".loraplane-vllm-complete"
DEFAULT_BASE_MODEL_NAME = "tiny-llama"


class VllmEnvError(RuntimeError):
    """The vLLM venv or the tiny model is missing or could not be made."""


class VllmServerError(ProcessError):
    """The vLLM server exited or did not become ready; the message holds its log tail."""


def vllm_venv_dir() -> Path:
    """Where scripts/vllm/install.sh puts the venv: a per-user cache that clones share."""
    if "LORAPLANE_VLLM_VENV" in os.environ:
        return Path(os.environ["LORAPLANE_VLLM_VENV"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "loraplane" / "vllm-venv"


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
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.python = python
        self.model_dir = model_dir
        self.log_path = log_path
        self.served_model_name = served_model_name
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.port = port or free_port()
        self.extra_args = tuple(extra_args)
        self.extra_env = dict(extra_env or {})
        self._child: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

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
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        if self._child is not None:
            raise VllmServerError("server already started")
        # Its own process group: stop() must also reach the EngineCore child process.
        self._child = ChildProcess("vLLM", self.command(), log_path=self.log_path,
                                   env=self.environment(), own_group=True,
                                   die_with_parent=False)
        try:
            self._child.start()
        except ProcessError as exc:
            self._child = None
            raise VllmServerError(str(exc)) from exc

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def is_running(self) -> bool:
        return self._child is not None and self._child.running

    def wait_ready(self, timeout: float = 240.0) -> float:
        """Poll GET /v1/models until it answers 200; return seconds waited."""
        if self._child is None:
            raise VllmServerError("server not started")
        try:
            return self._child.wait_ready(self._probe, timeout, interval_s=0.5)
        except ProcessError as exc:
            raise VllmServerError(str(exc)) from None

    def _probe(self) -> str | None:
        try:
            status = httpx.get(f"{self.url}/v1/models", timeout=5.0).status_code
        except httpx.TransportError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if status == 200 else f"GET /v1/models answered {status}"

    def loaded_adapters(self) -> list[str]:
        """The LoRA names vLLM lists under its base model right now."""
        models = httpx.get(f"{self.url}/v1/models", timeout=30.0).json()["data"]
        return [m["id"] for m in models if m.get("parent") is not None]

    def unload_all(self) -> None:
        """Unload every adapter, so the next user of a shared server starts from none."""
        for name in self.loaded_adapters():
            response = httpx.post(f"{self.url}/v1/unload_lora_adapter",
                                  json={"lora_name": name}, timeout=30.0)
            # 404: it went between the listing and the unload, which is what we want.
            if response.status_code not in (200, 404):
                raise VllmServerError(f"unloading {name} answered {response.status_code}: "
                                      f"{response.text[:200]}")

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the whole process group, then SIGKILL whatever is left after grace."""
        child, self._child = self._child, None
        if child is not None:
            child.stop(grace)

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

