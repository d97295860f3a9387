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
    service_networks,
    setting_fields,
    shell_cli_calls,
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
    if "token_file" in values:
        # The file exists only in the container (token_problems checks where it comes from).
        values.pop("token_file")
        values.setdefault("token", "lp_from-the-token-file")
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
    if settings.host != "0.0.0.0":
        problems.append(f"agent: listens on {settings.host}, unreachable from outside")
    if not any(str(p).endswith(f":{settings.port}") for p in services["agent"].get("ports", [])):
        problems.append(f"agent: container port {settings.port} is not published")
    return problems


def token_problems(compose: Compose) -> list[str]:
    """The agent reads an agent token that the one-shot ``agent-token`` leaves in a volume;
    no admin token (nor any literal token) is in its environment."""
    services = compose["services"]
    agent, minter = services["agent"], services.get("agent-token")
    env = environment(agent)
    admin = interpolate(environment(services["registry"]).get("LORAPLANE_ADMIN_TOKEN", ""))
    problems = []
    if "LORAPLANE_TOKEN" in env or any(admin and admin in interpolate(v) for v in env.values()):
        problems.append("agent: holds a token in its environment; it must read its agent "
                        "token from LORAPLANE_TOKEN_FILE")
    path = interpolate(env.get("LORAPLANE_TOKEN_FILE", ""))
    if minter is None or not path:
        return [*problems, "agent: no LORAPLANE_TOKEN_FILE written by an agent-token service"]
    if interpolate(environment(minter).get("TOKEN_FILE", "")) != path:
        problems.append(f"agent-token: does not write {path}")
    held, written = mount_of(agent, path), mount_of(minter, path)
    if held is None or written is None or held[1] != written[1]:
        problems.append(f"agent: {path} is not on the volume agent-token writes")
    if depends_on(agent).get("agent-token") != "service_completed_successfully":
        problems.append("agent: does not wait for agent-token to complete")
    if PROFILE not in (minter.get("profiles") or []):
        problems.append(f"agent-token: not in the {PROFILE!r} profile")
    calls = shell_cli_calls(minter)
    if not any(c[1:3] == ["token", "create"] and flag(c, "--role") == "agent" for c in calls):
        problems.append("agent-token: does not create a token with --role agent")
    return problems


def network_problems(compose: Compose) -> list[str]:
    """vLLM (runtime LoRA loading on) is reachable only from its agent."""
    services, declared = compose["services"], compose.get("networks") or {}
    vllm_nets = service_networks(services["vllm"])
    problems = []
    if services["vllm"].get("ports"):
        problems.append("vllm: publishes a port")
    for net in sorted(vllm_nets):
        if not (declared.get(net) or {}).get("internal"):
            problems.append(f"vllm: on network {net}, which is not internal")
        others = sorted(name for name, svc in services.items()
                        if name not in ("vllm", "agent") and net in service_networks(svc))
        if others:
            problems.append(f"vllm: shares network {net} with {', '.join(others)}")
    agent_nets = service_networks(services["agent"])
    if not vllm_nets & agent_nets:
        problems.append("agent: shares no network with vllm")
    if not service_networks(services["registry"]) & agent_nets:
        problems.append("agent: shares no network with the registry")
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
    return (problems + token_problems(compose) + network_problems(compose)
            + vllm_problems(compose) + shared_file_problems(compose)
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


def test_agent_reads_an_agent_token_never_the_admin_token() -> None:
    assert token_problems(load_compose()) == []


def test_only_the_agent_reaches_vllm() -> None:
    assert network_problems(load_compose()) == []


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
     "holds a token in its environment"),
    (lambda c: _agent_env(c).update(
        LORAPLANE_TOKEN="${LORAPLANE_ADMIN_TOKEN:-lp_local-only-admin-token-change-me}"),
     "holds a token in its environment"),
    (lambda c: _agent_env(c).pop("LORAPLANE_TOKEN_FILE"), "no LORAPLANE_TOKEN_FILE"),
    (lambda c: c["services"]["agent-token"]["environment"].update(TOKEN_FILE="/tmp/t"),
     "agent-token: does not write"),
    (lambda c: c["services"]["agent-token"].update(volumes=["other:/run/loraplane"]),
     "is not on the volume agent-token writes"),
    (lambda c: c["services"]["agent"]["depends_on"].pop("agent-token"),
     "does not wait for agent-token"),
    (lambda c: c["services"]["agent-token"].update(command=[
        c["services"]["agent-token"]["command"][0].replace("--role agent", "--role admin")]),
     "does not create a token with --role agent"),
    (lambda c: c["services"]["vllm"].pop("networks"), "vllm: on network default"),
    (lambda c: c["networks"]["vllm-net"].pop("internal"), "which is not internal"),
    (lambda c: c["services"]["s3"].update(networks=["default", "vllm-net"]),
     "vllm: shares network vllm-net with s3"),
    (lambda c: c["services"]["vllm"].update(ports=["127.0.0.1:8000:8000"]),
     "vllm: publishes a port"),
    (lambda c: c["services"]["agent"].update(networks=["default"]),
     "agent: shares no network with vllm"),
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
