"""The full demo on the embedded default: a registry (SQLite, local blobs, its own NATS),
a vLLM server on the tiny model and an inference agent, each a separate process. It
publishes v1, starts a long stream, publishes v2 while the stream runs, and prints a
timeline: when v2 was published, when it was first served, and that the v1 stream
finished on v1, unchanged. Everything it starts is stopped at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from devharness.processes import clean_env, http_probe, loraplane_command
from devharness.testbed import AgentProcess, AgentSpec, LoggedVllmServer, long_context_base
from devharness.vllm import VllmEnvError, ensure_tiny_model, ensure_vllm_env
from loraplane.client import AsyncRegistryClient
from loraplane.embedded_nats import PORT_FILE, EmbeddedAuth
from loraplane.nats_permissions import AGENT_USER, REGISTRY_USER
from loraplane.netutil import free_port
from loraplane.process import ChildProcess, ProcessError
from registry_service.settings import ADMIN_TOKEN_FILE
from scripts.demo_swap import BASE_MODEL, DemoError, run_scenario

ROOT = Path(__file__).resolve().parents[1]
# Survives runs (git-ignored): the tiny model is built once, each run's data is replaced.
ARTIFACTS = ROOT / ".artifacts" / "demo"
MODEL_DIR = ARTIFACTS / "tiny-model"
LAST_RUN = ARTIFACTS / "last-run"
# Room for the long stream. The base model's config is given as many positions
# (long_context_base): vLLM refuses a longer --max-model-len than the config's, and
# forcing it answers NaN past the config's positions.
MAX_MODEL_LEN = 2048
# vLLM on CPU keeps about two cores busy while it generates (engine and worker both
# spin): on a small machine the registry and the CLI would wait seconds behind it.
# Only the engine's processes are lowered, not the API server: niced with them, it
# got so little CPU that a stream's first text came out seconds late, all at once.
VLLM_NICE = 10
AGENT_SETTINGS = {"heartbeat_interval_s": "5", "shutdown_grace_s": "10",
                  "retry_base_s": "0.2", "retry_max_s": "2"}


def step(title: str) -> None:
    print(f"\n\033[1m== {title}\033[0m", flush=True)


class DemoVllmServer(LoggedVllmServer):
    """The demo's vLLM, its engine at a lower CPU priority: the engine still gets every
    idle cycle, but a push (CLI and registry) is not starved by the stream it should
    happen under, and neither is the API server that streams."""

    def wait_ready(self, timeout: float = 300.0) -> float:
        waited = super().wait_ready(timeout=timeout)
        if self.pid is not None:
            lower_priority(engine_processes(self.pid), VLLM_NICE)
        return waited


def engine_processes(leader: int) -> list[int]:
    """The other members of vLLM's process group (its engine core and worker): the
    server is started as the leader of a session of its own, which stop() relies on."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command name may hold spaces and parentheses: fields follow the last ")".
            group = int(stat.read_text().rsplit(")", 1)[1].split()[2])
            if group == leader and int(stat.parent.name) != leader:
                members.append(int(stat.parent.name))
    return members


def lower_priority(pids: list[int], niceness: int) -> None:
    """Renice every thread of ``pids`` (Linux keeps a nice value per thread; threads
    made later inherit their creator's)."""
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)


@dataclass(frozen=True)
class Cli:
    """``loraplane`` against the demo's registry, as the admin (the data dir's token)."""

    env: dict[str, str]

    def run(self, *args: str) -> None:
        print(f"$ loraplane {' '.join(args)}", flush=True)
        done = subprocess.run([*loraplane_command(), *args], env=self.env,
                              stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise DemoError(f"`loraplane {' '.join(args)}` exited with {done.returncode}")

    def api(self) -> AsyncRegistryClient:
        token = (Path(self.env["LORAPLANE_DATA_DIR"]) / ADMIN_TOKEN_FILE).read_text().strip()
        return AsyncRegistryClient(self.env["LORAPLANE_REGISTRY"], token, timeout_s=120)

    def json(self, *args: str) -> Any:
        done = subprocess.run([*loraplane_command(), "--json", *args], env=self.env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise DemoError(f"`loraplane {' '.join(args)}` exited with {done.returncode}:\n"
                            f"{done.stderr.strip() or done.stdout.strip()}")
        return json.loads(done.stdout)


@dataclass(frozen=True)
class Running:
    cli: Cli
    registry_url: str
    nats: DemoNats
    vllm: DemoVllmServer
    agent: AgentProcess
    model_dir: Path


def prepare_model() -> tuple[Path, Path]:
    """The vLLM venv's python (scripts/vllm/install.sh made it) and the tiny model."""
    step("the tiny model (built once into .artifacts/demo/tiny-model)")
    python = ensure_vllm_env()
    started = time.monotonic()
    ensure_tiny_model(MODEL_DIR, python, base_model_name=BASE_MODEL)
    print(f"{MODEL_DIR}: base model {BASE_MODEL!r} and adapters a1..a5 "
          f"({time.monotonic() - started:.1f}s)")
    return python, MODEL_DIR


def _exit_note(code: object) -> str:
    if not isinstance(code, int):
        return ""
    if code >= 0:
        return f", exit code {code}"
    if code == -signal.SIGTERM:
        # uvicorn re-raises the signal once its graceful shutdown has finished.
        return ", exited on SIGTERM after a graceful shutdown"
    return f", killed by {signal.Signals(-code).name}"


def _stopper(name: str, stop: Callable[[], object]) -> Callable[[], None]:
    def stop_and_say() -> None:
        started = time.monotonic()
        code = stop()
        print(f"stopped {name} ({time.monotonic() - started:.1f}s{_exit_note(code)})",
              flush=True)
    return stop_and_say


@dataclass(frozen=True)
class DemoNats:
    """The registry's embedded NATS: its address and its two users (registry, agent)."""

    url: str
    auth: EmbeddedAuth


def start_registry(run_dir: Path, stack: contextlib.ExitStack) -> tuple[Cli, str, DemoNats]:
    port = free_port()
    data_dir = run_dir / "registry"
    process = ChildProcess(
        "registry", [*loraplane_command(), "registry", "serve", "--port", str(port)],
        env=clean_env({"LORAPLANE_DATA_DIR": str(data_dir)}),
        log_path=run_dir / "registry.log", own_group=True)
    stack.callback(_stopper("the registry and its NATS", process.stop))
    process.start()
    url = f"http://127.0.0.1:{port}"
    seconds = process.wait_ready(http_probe(f"{url}/readyz"), 90, interval_s=0.2)
    # The embedded NATS's port, chosen at the data folder's first start, and the
    # passwords of its users are in the data folder.
    store = data_dir / "nats"
    nats_port = int((store / PORT_FILE).read_text())
    print(f"registry on {url} after {seconds:.1f}s: SQLite and blobs in {data_dir}, "
          f"its own NATS JetStream on :{nats_port} (users registry and agent)")
    cli = Cli(clean_env({"LORAPLANE_REGISTRY": url, "LORAPLANE_DATA_DIR": str(data_dir)}))
    return cli, url, DemoNats(f"nats://127.0.0.1:{nats_port}", EmbeddedAuth.read(store))


def agent_token(cli: Cli) -> str:
    print("$ loraplane token create demo-agent --role agent")
    created = cli.json("token", "create", "demo-agent", "--role", "agent")
    print(f"created token {created['id']} (role {created['role']}); "
          "the agent gets it by environment")
    secret: str = created["secret"]
    return secret


@contextlib.contextmanager
def running(run_dir: Path, python: Path, model_dir: Path) -> Iterator[Running]:
    """vLLM, the registry and the agent; stopped in reverse order whatever happens."""
    with contextlib.ExitStack() as stack:
        step("start vLLM, the registry (with NATS) and the agent")
        base = long_context_base(model_dir, MAX_MODEL_LEN)
        vllm = DemoVllmServer(python, base, run_dir / "vllm.log",
                                served_model_name=BASE_MODEL, max_loras=3,
                                extra_args=("--max-model-len", str(MAX_MODEL_LEN)))
        stack.callback(_stopper("vLLM", vllm.stop))
        vllm.start()  # ~35 s on CPU: the registry starts meanwhile
        cli, registry_url, nats = start_registry(run_dir, stack)
        token = agent_token(cli)
        print(f"vLLM on {vllm.url} ready after {vllm.wait_ready(timeout=400):.1f}s "
              f"(CPU build, --enable-lora --max-loras 3, engine at nice {VLLM_NICE})")
        spec = AgentSpec(agent_id="demo-agent", vllm_url=vllm.url, base_model=BASE_MODEL,
                         cache_dir=run_dir / "agent-cache",
                         base_model_config=model_dir / "base" / "config.json",
                         registry=registry_url, token=token, nats_url=nats.url,
                         max_loaded=3, max_lora_rank=vllm.max_lora_rank,
                         # The agent user consumes and may publish no event; its
                         # password goes by environment (LORAPLANE_NATS_PASSWORD).
                         settings={**AGENT_SETTINGS, "nats_user": AGENT_USER,
                                   "nats_password": nats.auth.passwords[AGENT_USER]})
        agent = AgentProcess(spec, run_dir)
        stack.callback(_stopper("the agent", agent.stop))
        print("$ loraplane agent " + " ".join(spec.argv(agent.port)[len(loraplane_command())
                                                                     + 1:]))
        print(f"agent on {agent.url} ready after {agent.start():.1f}s")
        yield Running(cli=cli, registry_url=registry_url, nats=nats, vllm=vllm,
                      agent=agent, model_dir=model_dir)
        step("stop everything")


def fresh_run_dir(given: Path | None) -> Path:
    if given is None:
        shutil.rmtree(LAST_RUN, ignore_errors=True)
        LAST_RUN.mkdir(parents=True)
        return LAST_RUN
    if given.exists() and any(given.iterdir()):
        raise DemoError(f"--data-dir {given} is not empty: the demo needs a fresh registry")
    given.mkdir(parents=True, exist_ok=True)
    return given


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM unwinds like Ctrl-C, so every process is still stopped.
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path,
                        help="an empty folder for this run's data and logs "
                             f"(default: {LAST_RUN.relative_to(ROOT)}, replaced each run)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    run_dir: Path | None = None
    try:
        run_dir = fresh_run_dir(args.data_dir)
        python, model_dir = prepare_model()
        with running(run_dir, python, model_dir) as parts:
            # The event watch reads the subjects as the registry's user: the agent's
            # may only pull from its consumer.
            asyncio.run(run_scenario(parts.cli, parts.agent.url, parts.vllm.url,
                                     parts.nats.url, model_dir / "adapters",
                                     nats_security=parts.nats.auth.security(REGISTRY_USER)))
    except KeyboardInterrupt:
        print("\ninterrupted: everything the demo started is stopped", file=sys.stderr)
        raise SystemExit(130) from None
    except (DemoError, ProcessError, VllmEnvError) as exc:
        logs = f"\nlogs: {run_dir}" if run_dir is not None else ""
        print(f"\n\033[31mdemo failed:\033[0m {exc}{logs}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"\ndone: everything stopped; data and logs in {run_dir}")


if __name__ == "__main__":
    main()
