"""Every part of loraplane as a real process: registry, agents, vLLM servers.

Used by the end-to-end tests, the demo and the benchmarks. Each part runs exactly as an
operator would start it (``loraplane registry serve``, ``loraplane agent``, vLLM's
OpenAI server from its own venv), in its own process group, with its output in a log
file, and is stopped with SIGTERM, then SIGKILL after a grace period (see
``loraplane/process.py``; start them from the main thread).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from devharness.processes import clean_env, http_probe, loraplane_command
from devharness.services import NatsService, SeaweedS3
from devharness.vllm import VllmServer
from loraplane.netutil import free_port
from loraplane.process import ChildProcess, ProcessError


class TestbedError(ProcessError):
    """A part of the testbed failed to set up; the message says which and why."""

    __test__ = False  # a name pytest would otherwise try to collect from test modules


# --- registry -------------------------------------------------------------------------


@dataclass(frozen=True)
class S3Bucket:
    """Where the registry keeps its blobs, and the credentials to look at them."""

    s3: SeaweedS3
    bucket: str

    def key(self, sha256: str) -> str:
        return f"sha256/{sha256[0:2]}/{sha256[2:4]}/{sha256}"

    def overwrite(self, sha256: str, content: bytes) -> None:
        """Replace a stored blob behind the registry's back (the registry keeps its hash)."""
        client = self.s3.client()
        try:
            client.head_object(Bucket=self.bucket, Key=self.key(sha256))  # must exist
            client.put_object(Bucket=self.bucket, Key=self.key(sha256), Body=content)
        finally:
            client.close()


class RegistryProcess:
    """``loraplane registry serve`` on Postgres, S3 and an external NATS."""

    def __init__(self, work_dir: Path, *, database_url: str, nats_url: str,
                 blobs: S3Bucket, admin_token: str | None = None,
                 relay_poll_interval_s: float = 0.2,
                 settings: Mapping[str, str] | None = None) -> None:
        """``settings``: more ``LORAPLANE_*`` variables, by setting (``agent_stale_after_s``)."""
        self.work_dir = work_dir
        self.admin_token = admin_token or f"lp_e2e-admin-{secrets.token_hex(16)}"
        self.blobs = blobs
        self.port = free_port()
        s3 = blobs.s3
        self.settings = {
            "LORAPLANE_DATA_DIR": str(work_dir / "data"),
            "LORAPLANE_DATABASE_URL": database_url,
            "LORAPLANE_AUTO_MIGRATE": "false",
            "LORAPLANE_NATS_URL": nats_url,
            "LORAPLANE_S3_ENDPOINT": s3.endpoint_url,
            "LORAPLANE_S3_BUCKET": blobs.bucket,
            "LORAPLANE_S3_ACCESS_KEY": s3.access_key,
            "LORAPLANE_S3_SECRET_KEY": s3.secret_key,
            "LORAPLANE_S3_REGION": s3.region,
            "LORAPLANE_S3_PATH_STYLE": "true",
            "LORAPLANE_S3_CREATE_BUCKET": "true",
            "LORAPLANE_ADMIN_TOKEN": self.admin_token,
            "LORAPLANE_RELAY_POLL_INTERVAL_S": str(relay_poll_interval_s),
            **{f"LORAPLANE_{k.upper()}": v for k, v in (settings or {}).items()},
        }
        self.process = self._process()

    def _process(self) -> ChildProcess:
        argv = [*loraplane_command(), "registry", "serve", "--port", str(self.port)]
        return ChildProcess("registry", argv, env=clean_env(self.settings),
                            log_path=self.work_dir / "registry.log", own_group=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    def metrics(self) -> str:
        return scrape(self.url)

    def migrate(self, timeout_s: float = 120.0) -> None:
        done = subprocess.run(
            [*loraplane_command(), "registry", "migrate"], env=clean_env(self.settings),
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s,
            check=False)
        if done.returncode != 0:
            raise TestbedError(f"loraplane registry migrate exited with {done.returncode}:\n"
                               f"{done.stdout}\n{done.stderr}")

    def start(self, timeout_s: float = 90.0, attempts: int = 3) -> float:
        """Start and wait for ``/readyz``; a port taken meanwhile is retried on another."""
        for attempt in range(1, attempts + 1):
            self.process.start()
            try:
                return self.process.wait_ready(http_probe(f"{self.url}/readyz"), timeout_s,
                                               interval_s=0.2)
            except ProcessError:
                self.process.stop(grace_s=5)
                if attempt == attempts or "address already in use" not in self.process.tail():
                    raise
                self.port = free_port()
                self.process = self._process()
        raise AssertionError("unreachable")

    def stop(self) -> int | None:
        return self.process.stop()

    def create_token(self, role: str, name: str, tenant: str | None = None) -> str:
        """A new token's secret, made through the API with the admin token."""
        body: dict[str, Any] = {"name": name, "role": role}
        if tenant is not None:
            body["tenant"] = tenant
        response = httpx.post(f"{self.url}/v1/tokens", json=body, headers=self.admin_headers,
                              timeout=30)
        if response.status_code != 201:
            raise TestbedError(f"creating a {role} token: {response.status_code} {response.text}")
        secret: str = response.json()["secret"]
        return secret


# --- agents -----------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentSpec:
    """The flags of one ``loraplane agent``; ``settings`` are extra ``LORAPLANE_*``
    variables for settings without a flag (``RESYNC_INTERVAL_S``, ...)."""

    agent_id: str
    vllm_url: str
    base_model: str
    cache_dir: Path
    base_model_config: Path | None = None
    registry: str | None = None
    token: str | None = None
    nats_url: str | None = None
    max_loaded: int = 3
    max_lora_rank: int = 16
    watch_dir: Path | None = None
    pins: tuple[str, ...] = ()
    settings: Mapping[str, str] = field(default_factory=dict)

    def argv(self, port: int) -> list[str]:
        argv = [*loraplane_command(), "agent", "--agent-id", self.agent_id,
                "--vllm-url", self.vllm_url, "--base-model", self.base_model,
                "--cache-dir", str(self.cache_dir), "--max-loaded", str(self.max_loaded),
                "--max-lora-rank", str(self.max_lora_rank),
                "--host", "127.0.0.1", "--port", str(port)]
        optional = {"--registry": self.registry, "--nats-url": self.nats_url,
                    "--base-model-config": self.base_model_config,
                    "--watch-dir": self.watch_dir}
        for flag, value in optional.items():
            if value is not None:
                argv += [flag, str(value)]
        for pin in self.pins:
            argv += ["--pin", pin]
        return argv

    def env(self) -> dict[str, str]:
        # The token goes by environment, not argv, where `ps` would show it.
        extra = {f"LORAPLANE_{k.upper()}": v for k, v in self.settings.items()}
        if self.token is not None:
            extra["LORAPLANE_TOKEN"] = self.token
        return clean_env(extra)


class AgentProcess:
    """One ``loraplane agent``; ``restart`` keeps its port (and may change its flags)."""

    def __init__(self, spec: AgentSpec, log_dir: Path, port: int | None = None) -> None:
        """``port`` None: one that is free now (another process may take it first)."""
        self.spec = spec
        self.log_dir = log_dir
        self.port = port or free_port()
        self.process = self._process()

    def _process(self) -> ChildProcess:
        return ChildProcess(self.spec.agent_id, self.spec.argv(self.port), env=self.spec.env(),
                            log_path=self.log_dir / f"{self.spec.agent_id}.log", own_group=True)

    @property
    def agent_id(self) -> str:
        return self.spec.agent_id

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0) -> float:
        """Start and wait until ``/readyz`` says ready; seconds waited."""
        self.process.start()
        return self.process.wait_ready(http_probe(f"{self.url}/readyz"), timeout_s,
                                       interval_s=0.2)

    def stop(self, grace_s: float = 30.0) -> int | None:
        return self.process.stop(grace_s)

    def restart(self, spec: AgentSpec | None = None, timeout_s: float = 120.0) -> float:
        self.stop()
        if spec is not None:
            self.spec = spec
        self.process = self._process()
        return self.start(timeout_s)

    def variant(self, **changes: Any) -> AgentSpec:
        return replace(self.spec, **changes)

    def metrics(self) -> str:
        return scrape(self.url)


def scrape(url: str) -> str:
    """The Prometheus text a loraplane service serves at ``url``/metrics."""
    response = httpx.get(f"{url}/metrics", timeout=10)
    response.raise_for_status()
    return response.text


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v
                                           for k, v in labels.items()):
                total += sample.value
    return total


# --- the whole testbed ----------------------------------------------------------------------


# The tenant of the adapters tests and benchmarks create on a testbed.
E2E_TENANT = "e2e"


@dataclass
class Testbed:
    """A registry, NATS, S3, and per host one vLLM with its agent, all running."""

    __test__ = False  # a name pytest would otherwise try to collect from test modules

    work_dir: Path
    model_dir: Path
    base_dir: Path  # what vLLM serves: model_dir/base, or a longer-context copy of it
    base_model: str
    registry: RegistryProcess
    nats: NatsService
    blobs: S3Bucket
    agent_tokens: dict[str, str]
    # An inference token of E2E_TENANT, the tenant the tests' adapters belong to.
    inference_token: str
    vllms: dict[str, LoggedVllmServer]
    agents: dict[str, AgentProcess]

    def adapter_dir(self, name: str) -> Path:
        return self.model_dir / "adapters" / name

    @property
    def base_config(self) -> Path:
        return self.base_dir / "config.json"


class LoggedVllmServer(VllmServer):
    """A ``VllmServer`` whose log is written as things happen (tests read it)."""

    def environment(self) -> dict[str, str]:
        return {**super().environment(), "PYTHONUNBUFFERED": "1"}

    def load_requests(self) -> int:
        """How many ``POST /v1/load_lora_adapter`` the server has answered so far."""
        log = self.log_path.read_text(errors="replace")
        return log.count('"POST /v1/load_lora_adapter HTTP/1.1"')


def long_context_base(model_dir: Path, positions: int) -> Path:
    """The tiny base model with room for ``positions`` tokens; the same model otherwise.

    Long streams are what keep a request in flight while a swap or an eviction happens
    around it. Llama's positions are rotary, computed from the config, so only
    ``max_position_embeddings`` changes. Forcing a longer ``--max-model-len`` instead
    (VLLM_ALLOW_LONG_MAX_MODEL_LEN) indexes vLLM's rotary table (sized from the config)
    past its end; a run that did so saw every later request on that server answer empty
    text (NaN logits pick token 0, a special token).
    """
    base = model_dir / "base"
    config = json.loads((base / "config.json").read_text())
    if config["max_position_embeddings"] >= positions:
        return base
    longer = model_dir / f"base-{positions}"
    if not (longer / "config.json").is_file():
        staging = model_dir / f".base-{positions}-{secrets.token_hex(4)}"
        shutil.copytree(base, staging)
        config["max_position_embeddings"] = positions
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        staging.rename(longer)
    return longer


def agent_spec(work_dir: Path, agent_id: str, vllm: VllmServer, *, base_model: str,
               base_config: Path, registry_url: str, token: str, nats_url: str,
               max_loaded: int, settings: Mapping[str, str]) -> AgentSpec:
    return AgentSpec(agent_id=agent_id, vllm_url=vllm.url, base_model=base_model,
                     cache_dir=work_dir / f"cache-{agent_id}", base_model_config=base_config,
                     registry=registry_url, token=token, nats_url=nats_url,
                     max_loaded=max_loaded, max_lora_rank=vllm.max_lora_rank,
                     settings=settings)


def start_vllms(servers: Sequence[VllmServer], timeout_s: float = 400.0) -> None:
    """Start every server at once (each takes ~35 s alone), then wait for all."""
    for server in servers:
        server.start()
    for server in servers:
        server.wait_ready(timeout=timeout_s)


@contextlib.contextmanager
def running_testbed(work_dir: Path, *, model_dir: Path, vllm_python: Path, database_url: str,
                    nats: NatsService, s3: SeaweedS3, hosts: Sequence[str] = ("a", "b"),
                    base_model: str = "tiny-llama", max_loras: int = 3, max_loaded: int = 3,
                    max_model_len: int = 2048, max_lora_rank: int = 16,
                    agent_settings: Mapping[str, Mapping[str, str]] | None = None,
                    vllm_env: Mapping[str, str] | None = None,
                    registry_settings: Mapping[str, str] | None = None,
                    ) -> Iterator[Testbed]:
    """Migrate and start the registry, one vLLM and one agent per host (``agent-<host>``);
    stop everything on exit, whatever happened. ``vllm_env``: more environment for every
    vLLM (its LoRA resolver plugin, for one); ``registry_settings``: more settings of the
    registry (see ``RegistryProcess``)."""
    with contextlib.ExitStack() as stack:
        blobs = S3Bucket(s3, f"e2e-{secrets.token_hex(6)}")
        registry = RegistryProcess(work_dir / "registry", database_url=database_url,
                                   nats_url=nats.url, blobs=blobs, settings=registry_settings)
        registry.migrate()
        stack.callback(registry.stop)
        registry.start()
        base = long_context_base(model_dir, max_model_len)
        vllms = {h: LoggedVllmServer(vllm_python, base, work_dir / f"vllm-{h}.log",
                                     served_model_name=base_model, max_loras=max_loras,
                                     max_lora_rank=max_lora_rank, extra_env=vllm_env,
                                     # The last --max-model-len given wins.
                                     extra_args=("--max-model-len", str(max_model_len)))
                 for h in hosts}
        for server in vllms.values():
            stack.callback(server.stop)
        start_vllms(list(vllms.values()))
        agents: dict[str, AgentProcess] = {}
        tokens: dict[str, str] = {}
        for host, server in vllms.items():
            # An agent token reports for one agent only.
            token = tokens[host] = registry.create_token("agent", f"e2e-agent-{host}")
            spec = agent_spec(work_dir, f"agent-{host}", server, base_model=base_model,
                              base_config=base / "config.json",
                              registry_url=registry.url, token=token, nats_url=nats.url,
                              max_loaded=max_loaded,
                              settings=(agent_settings or {}).get(host, {}))
            agents[host] = AgentProcess(spec, work_dir / "agents")
            stack.callback(agents[host].stop)
            agents[host].start()
        inference = registry.create_token("inference", "e2e-client", tenant=E2E_TENANT)
        yield Testbed(work_dir=work_dir, model_dir=model_dir, base_dir=base, base_model=base_model,
                    registry=registry, nats=nats, blobs=blobs, agent_tokens=tokens,
                    inference_token=inference, vllms=vllms, agents=agents)
