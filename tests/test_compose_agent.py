"""compose.yaml's inference side (vLLM and the agent, profile ``gpu``), checked without
a Docker engine.

What an engine would only find at run time: the agent's environment is one that
``AgentSettings`` accepts; it reaches the registry, NATS and vLLM under their service
names and ports; it and vLLM agree on the base model, the LoRA rank and the number of
loaded versions; vLLM can read the files the agent tells it to load (the agent's cache,
mounted at the same path) and the base model's config the agent checks adapters
against; vLLM gets a GPU and runtime LoRA updating; both have real healthchecks and the
agent starts only once the registry and vLLM are healthy. The agent's command is parsed
by the real click command (``image_problems`` of ``compose_support.py``).
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from inference_agent.settings import AgentSettings
from tests.compose_support import (
    DOCKERFILE,
    PREFIX,
    Compose,
    cli_problems,
    depends_on,
    dockerfile_instructions,
    env_problems,
    environment,
    healthcheck_text,
    image_argv,
    image_problems,
    interpolate,
    load_compose,
    service_command,
    setting_fields,
)

PROFILE = "gpu"
VLLM_DEFAULT_PORT = "8000"
# Paths that only exist inside the containers; checked against the mounts instead.
CONTAINER_PATHS = ("base_model_config", "watch_dir")


class ComposeAgentSettings(AgentSettings):
    """AgentSettings from keyword arguments only: nothing of the test machine leaks in."""

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def agent_values(compose: Compose) -> dict[str, str]:
    """The agent's settings by field name, with the local defaults interpolated."""
    env = environment(compose["services"].get("agent", {}))
    return {k[len(PREFIX):].lower(): interpolate(v) for k, v in env.items()
            if k.startswith(PREFIX)}


def agent_settings_from(compose: Compose) -> AgentSettings:
    values: dict[str, Any] = {k: v for k, v in agent_values(compose).items()
                              if k not in CONTAINER_PATHS}
    return ComposeAgentSettings(**values)


def flag(args: list[str], name: str, default: str | None = None) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` (the last one wins, as in vLLM)."""
    found = default
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(f"{name}="):
            found = arg.split("=", 1)[1]
    return found


def vllm_args(compose: Compose) -> list[str]:
    return [interpolate(a) for a in service_command(compose["services"].get("vllm", {})) or []]


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> source (a volume name or a host path), short or long syntax."""
    found = {}
    for entry in service.get("volumes") or []:
        if isinstance(entry, str):
            parts = interpolate(entry).split(":")
            if len(parts) >= 2:
                found[parts[1]] = parts[0]
        else:
            found[str(entry["target"])] = interpolate(str(entry.get("source", "")))
    return found


def mount_of(service: dict[str, Any], path: str) -> tuple[str, str] | None:
    """The (target, source) of the mount that holds ``path``, the deepest one."""
    holding = [(target, source) for target, source in mounts(service).items()
               if PurePosixPath(path).is_relative_to(target)]
    return max(holding, key=lambda m: len(m[0])) if holding else None


def _points_at(url: str, host: str, port: str | int) -> bool:
    parts = urlsplit(url)
    return parts.hostname == host and str(parts.port) == str(port)


# --- the checks -------------------------------------------------------------------------


def agent_problems(compose: Compose) -> list[str]:
    """The agent's settings are valid and name the registry, NATS and vLLM services."""
    services = compose["services"]
    if "agent" not in services or "vllm" not in services:
        return ["the agent and vllm services are missing"]
    try:
        settings = agent_settings_from(compose)
    except ValidationError as exc:
        return [f"agent: its environment is refused: {exc}"]
    registry = {k: interpolate(v) for k, v in environment(services["registry"]).items()}
    problems = []
    if not _points_at(settings.registry or "", "registry",
                      registry.get("LORAPLANE_PORT", "8080")):
        problems.append(f"agent: {settings.registry} does not point at the registry service")
    if settings.nats_url != registry.get("LORAPLANE_NATS_URL"):
        problems.append(f"agent: follows {settings.nats_url}, the registry publishes on "
                        f"{registry.get('LORAPLANE_NATS_URL')}")
    vllm_port = flag(vllm_args(compose), "--port", VLLM_DEFAULT_PORT) or ""
    if not _points_at(settings.vllm_url, "vllm", vllm_port):
        problems.append(f"agent: {settings.vllm_url} does not point at the vllm service "
                        f"on port {vllm_port}")
    token = environment(services["agent"]).get("LORAPLANE_TOKEN", "")
    if not token.startswith("${LORAPLANE_AGENT_TOKEN"):
        problems.append("agent: LORAPLANE_TOKEN must come from the environment "
                        "(LORAPLANE_AGENT_TOKEN)")
    elif settings.token is None or (settings.token.get_secret_value()
                                    != registry.get("LORAPLANE_ADMIN_TOKEN")):
        problems.append("agent: its local default token is not the registry's local admin "
                        "token: `docker compose up` would give it a 401")
    if settings.host != "0.0.0.0":
        problems.append(f"agent: listens on {settings.host}, unreachable from outside")
    if not any(str(p).endswith(f":{settings.port}") for p in services["agent"].get("ports", [])):
        problems.append(f"agent: container port {settings.port} is not published")
    return problems


def vllm_problems(compose: Compose) -> list[str]:
    """vLLM serves what the agent expects, with LoRA updating at run time, on a GPU."""
    try:
        settings = agent_settings_from(compose)
    except ValidationError:
        return []  # agent_problems says why
    vllm = compose["services"]["vllm"]
    args = vllm_args(compose)
    problems = []
    if environment(vllm).get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() not in (
            "true", "1"):
        problems.append("vllm: VLLM_ALLOW_RUNTIME_LORA_UPDATING is not True: the agent "
                        "could not load or unload adapters")
    if "--enable-lora" not in args:
        problems.append("vllm: LoRA is not enabled (--enable-lora)")
    served = flag(args, "--served-model-name", flag(args, "--model"))
    if served != settings.base_model:
        problems.append(f"vllm: serves {served!r}, the agent expects {settings.base_model!r}")
    rank = flag(args, "--max-lora-rank", "16")
    if rank != str(settings.max_lora_rank):
        problems.append(f"vllm: --max-lora-rank {rank}, the agent checks adapters against "
                        f"{settings.max_lora_rank}")
    slots = int(flag(args, "--max-cpu-loras", flag(args, "--max-loras", "1")) or 1)
    if settings.max_loaded > slots:
        problems.append(f"vllm: holds {slots} adapters, the agent keeps {settings.max_loaded} "
                        "loaded")
    devices = (vllm.get("deploy", {}).get("resources", {}).get("reservations", {})
               .get("devices", []))
    if not any("gpu" in (d.get("capabilities") or []) for d in devices):
        problems.append("vllm: no GPU reserved (deploy.resources.reservations.devices)")
    for name in ("vllm", "agent"):
        if PROFILE not in (compose["services"][name].get("profiles") or []):
            problems.append(f"{name}: not in the {PROFILE!r} profile: `docker compose up` "
                            "would need a GPU")
    return problems


def shared_file_problems(compose: Compose) -> list[str]:
    """vLLM reads what the agent names: cached versions and the base model's folder."""
    services = compose["services"]
    agent, vllm = services["agent"], services["vllm"]
    values = agent_values(compose)
    problems = []
    cache = values.get("cache_dir", "")
    held = mount_of(agent, cache) if cache else None
    if held is None:
        problems.append(f"agent: its cache {cache or '(default)'} is not on a volume")
    elif mounts(vllm).get(held[0]) != held[1]:
        problems.append(f"vllm: does not mount {held[1]} at {held[0]}: it cannot read the "
                        "adapter versions the agent loads from its cache")
    config = values.get("base_model_config")
    model = flag(vllm_args(compose), "--model") or ""
    if config is None:
        problems.append("agent: no LORAPLANE_BASE_MODEL_CONFIG: adapter shapes go unchecked")
    elif str(PurePosixPath(config).parent) != model:
        problems.append(f"agent: checks against {config}, vLLM serves the model in {model}")
    elif mount_of(agent, config) != mount_of(vllm, model) or mount_of(agent, config) is None:
        problems.append(f"agent: {config} is not the folder vLLM mounts at {model}")
    return problems


def health_problems(compose: Compose) -> list[str]:
    services = compose["services"]
    problems = []
    waits = depends_on(services["agent"])
    for target in ("registry", "vllm"):
        if waits.get(target) != "service_healthy":
            problems.append(f"agent: does not wait for {target} to be healthy")
    port = flag(vllm_args(compose), "--port", VLLM_DEFAULT_PORT)
    if f":{port}/health" not in (healthcheck_text(services["vllm"]) or ""):
        problems.append(f"vllm: the healthcheck does not probe /health on port {port}")
    agent_port = agent_values(compose).get("port", "9000")
    if f":{agent_port}/readyz" not in (healthcheck_text(services["agent"]) or ""):
        problems.append(f"agent: the healthcheck does not probe /readyz on port {agent_port}")
    return problems


def command_problems(compose: Compose) -> list[str]:
    """The agent's command, as the image runs it, parsed by the real click command."""
    argv = image_argv(dockerfile_instructions(DOCKERFILE.read_text()),
                      service_command(compose["services"]["agent"]))
    if argv[1:2] != ["agent"]:
        return [f"agent: runs {shlex.join(argv)}, not `loraplane agent`"]
    return [f"agent: {p}" for p in cli_problems(argv)]


def all_problems(compose: Compose) -> list[str]:
    problems = agent_problems(compose)
    if "the agent and vllm services are missing" in problems:
        return problems
    return (problems + vllm_problems(compose) + shared_file_problems(compose)
            + health_problems(compose) + command_problems(compose) + env_problems(compose)
            + image_problems(compose))


# --- tests ------------------------------------------------------------------------------


def test_agent_variables_are_agent_settings() -> None:
    fields = setting_fields(AgentSettings)
    env = environment(load_compose()["services"]["agent"])
    assert [k for k in env if k.startswith(PREFIX) and k not in fields] == []
    assert env_problems(load_compose()) == []


def test_agent_settings_are_valid_and_wired_to_the_services() -> None:
    assert agent_problems(load_compose()) == []


def test_vllm_serves_what_the_agent_expects_on_a_gpu() -> None:
    assert vllm_problems(load_compose()) == []


def test_vllm_reads_the_agents_cache_and_model_config() -> None:
    assert shared_file_problems(load_compose()) == []


def test_agent_waits_for_healthy_services_and_is_checked() -> None:
    assert health_problems(load_compose()) == []


def test_agent_command_parses_with_the_cli() -> None:
    assert command_problems(load_compose()) == []


# --- the checks can fail ----------------------------------------------------------------


def _agent_env(c: Compose) -> dict[str, Any]:
    env: dict[str, Any] = c["services"]["agent"]["environment"]
    return env


def _vllm_command(c: Compose, name: str, value: str) -> None:
    args = c["services"]["vllm"]["command"]
    args[args.index(name) + 1] = value


def _drop_cache_mount(c: Compose) -> None:
    c["services"]["vllm"]["volumes"] = [v for v in c["services"]["vllm"]["volumes"]
                                        if not (isinstance(v, dict)
                                                and v.get("source") == "agent-data")]


BROKEN: list[tuple[Callable[[Compose], None], str]] = [
    (lambda c: _agent_env(c).update(LORAPLANE_VLLM_ENDPOINT="http://vllm:8000"),
     "LORAPLANE_VLLM_ENDPOINT is not a AgentSettings field"),
    (lambda c: _agent_env(c).update(LORAPLANE_S3_BUCKET="adapters"),
     "LORAPLANE_S3_BUCKET is not a AgentSettings field"),
    (lambda c: _agent_env(c).update(LORAPLANE_VLLM_URL="vllm:8000"), "vllm_url"),
    (lambda c: _agent_env(c).update(LORAPLANE_VLLM_URL="http://127.0.0.1:8000"),
     "does not point at the vllm service"),
    (lambda c: _agent_env(c).update(LORAPLANE_REGISTRY="http://registry:9999"),
     "does not point at the registry service"),
    (lambda c: _agent_env(c).update(LORAPLANE_NATS_URL="nats://nats:4333"),
     "the registry publishes on"),
    (lambda c: _agent_env(c).update(LORAPLANE_TOKEN="lp_hardcoded"),
     "must come from the environment"),
    (lambda c: _agent_env(c).update(LORAPLANE_TOKEN="${LORAPLANE_AGENT_TOKEN:-lp_other}"),
     "would give it a 401"),
    (lambda c: _vllm_command(c, "--max-lora-rank", "16"), "--max-lora-rank 16"),
    (lambda c: _vllm_command(c, "--served-model-name", "other"), "serves 'other'"),
    (lambda c: _vllm_command(c, "--max-loras", "2"), "holds 2 adapters"),
    (lambda c: c["services"]["vllm"]["environment"].pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
     "VLLM_ALLOW_RUNTIME_LORA_UPDATING is not True"),
    (lambda c: c["services"]["vllm"].pop("deploy"), "no GPU reserved"),
    (lambda c: c["services"]["agent"].pop("profiles"), "agent: not in the 'gpu' profile"),
    (_drop_cache_mount, "it cannot read the adapter versions"),
    (lambda c: _agent_env(c).update(LORAPLANE_CACHE_DIR="/tmp/cache"), "is not on a volume"),
    (lambda c: _agent_env(c).update(LORAPLANE_BASE_MODEL_CONFIG="/models/other/config.json"),
     "vLLM serves the model in /models/base"),
    (lambda c: c["services"]["agent"]["depends_on"].pop("vllm"),
     "does not wait for vllm to be healthy"),
    (lambda c: c["services"]["vllm"]["healthcheck"].update(test=["CMD", "true"]),
     "vllm: the healthcheck does not probe /health"),
    (lambda c: _agent_env(c).update(LORAPLANE_PORT="9100"),
     "does not probe /readyz on port 9100"),
    (lambda c: c["services"]["agent"].update(command=["agent", "--vllm", "http://vllm"]),
     "No such option '--vllm'"),
    (lambda c: c["services"]["agent"].update(command=["registry", "serve"]),
     "not `loraplane agent`"),
]


@pytest.mark.parametrize(("change", "expected"), BROKEN, ids=[e for _, e in BROKEN])
def test_checks_catch_a_broken_inference_side(change: Callable[[Compose], None],
                                              expected: str) -> None:
    compose = copy.deepcopy(load_compose())
    assert all_problems(compose) == []
    change(compose)
    problems = all_problems(compose)
    assert any(expected in p for p in problems), problems
