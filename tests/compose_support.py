"""compose.yaml and the Dockerfile as data: the readers and the checks that both
``test_compose.py`` (the registry side) and ``test_compose_agent.py`` (the inference side)
use. Each check returns a list of problems, so a test can also feed it a broken copy.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic_settings import BaseSettings

from inference_agent.settings import AgentSettings
from loraplane_cli.main import cli
from registry_service.settings import RegistrySettings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = ROOT / "pyproject.toml"

PREFIX = "LORAPLANE_"
# What the registry needs to run on Postgres + S3 + NATS instead of the embedded default.
REQUIRED_REGISTRY_ENV = (
    "LORAPLANE_DATABASE_URL", "LORAPLANE_S3_ENDPOINT", "LORAPLANE_S3_BUCKET",
    "LORAPLANE_S3_ACCESS_KEY", "LORAPLANE_S3_SECRET_KEY", "LORAPLANE_NATS_URL",
    "LORAPLANE_ADMIN_TOKEN",
)

Compose = dict[str, Any]


def load_compose() -> Compose:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict), "compose.yaml is not a mapping"
    return data


# --- helpers ----------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?-(?P<default>[^}]*))?\}")


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR:-default}`` with ``env`` (not the caller's environment) and ``$$``."""
    env = env or {}

    def one(match: re.Match[str]) -> str:
        name, default = match["name"], match["default"]
        if name in env:
            return env[name]
        if default is None:
            raise ValueError(f"${{{name}}} has no default: `docker compose up` needs it set")
        return default

    return _VARIABLE.sub(one, value).replace("$$", "$")


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a mapping (Compose allows a mapping or a list)."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        pairs = (item.split("=", 1) if "=" in item else (item, "") for item in raw)
        return {k: v for k, v in pairs}
    return {str(k): "" if v is None else str(v) for k, v in raw.items()}


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """Dependency name -> condition (the short list form means service_started)."""
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return {str(name): "service_started" for name in raw}
    return {str(name): str((spec or {}).get("condition", "service_started"))
            for name, spec in raw.items()}


def setting_fields(settings: type[BaseSettings] = RegistrySettings) -> set[str]:
    prefix = str(settings.model_config.get("env_prefix", ""))
    assert prefix == PREFIX, f"{settings.__name__} reads {prefix!r}, this test expects {PREFIX!r}"
    return {prefix + name.upper() for name in settings.model_fields}


def service_networks(service: dict[str, Any]) -> set[str]:
    """The networks a service joins (none named: the project's ``default``)."""
    raw = service.get("networks")
    return {str(n) for n in raw} if raw else {"default"}


def runs_shell(service: dict[str, Any]) -> bool:
    """The service runs a shell script in the image (a one-shot that calls the CLI)."""
    entrypoint = service.get("entrypoint") or []
    return "build" in service and bool(entrypoint) and entrypoint[0] in ("/bin/sh", "sh")


def python_script(service: dict[str, Any]) -> str | None:
    """The script of a one-shot that runs ``python -c`` in the image, else None."""
    entrypoint = service.get("entrypoint") or []
    command = service_command(service) or []
    if "build" in service and entrypoint[:2] == ["python", "-c"] and len(command) == 1:
        return command[0]
    return None


def cli_envvars() -> set[str]:
    """The ``LORAPLANE_*`` variables the CLI's global options read."""
    return {str(p.envvar) for p in cli.params if isinstance(getattr(p, "envvar", None), str)}


def shell_cli_calls(service: dict[str, Any]) -> list[list[str]]:
    """Each ``loraplane ...`` call in a shell service's script, as argv."""
    command = service.get("command") or []
    script = interpolate(command if isinstance(command, str) else "\n".join(command))
    return [shlex.split(m) for m in re.findall(r"\bloraplane\b[^;|&>\n]*", script)]


def runs_agent(service: dict[str, Any]) -> bool:
    """The service runs `loraplane agent` (whose settings are AgentSettings)."""
    return "build" in service and (service_command(service) or [""])[0] == "agent"


def healthcheck_text(service: dict[str, Any]) -> str | None:
    check = service.get("healthcheck")
    if not check or check.get("disable"):
        return None
    test = check.get("test")
    if isinstance(test, list):
        if not test or test[0] == "NONE":
            return None
        return " ".join(str(part) for part in test[1:])
    return str(test) if test else None


def service_command(service: dict[str, Any]) -> list[str] | None:
    command = service.get("command")
    if command is None:
        return None
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def loraplane_services(compose: Compose) -> dict[str, dict[str, Any]]:
    """Services that run the image built from this repository's Dockerfile."""
    return {name: svc for name, svc in compose["services"].items() if "build" in svc}


# --- Dockerfile -------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, rest = line.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    return instructions


def exec_form(arguments: str) -> list[str]:
    """ENTRYPOINT/CMD arguments; only the JSON (exec) form passes signals to the server."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not the JSON exec form: {arguments}") from exc
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"not a list of strings: {arguments}")
    return value


def base_image(from_args: str, instructions: list[tuple[str, str]]) -> str:
    """A FROM's image with the ARG defaults declared before the first FROM filled in:
    what users get when they build without --build-arg."""
    defaults: dict[str, str] = {}
    for keyword, args in instructions:
        if keyword == "FROM":
            break
        if keyword == "ARG":
            name, _, value = args.partition("=")
            defaults[name.strip()] = value.strip()
    image = from_args.split(maxsplit=1)[0]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)",
                  lambda m: defaults.get(m.group(1) or m.group(2), m.group(0)), image)


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM"]
    return instructions[starts[-1]:] if starts else []


def image_argv(instructions: list[tuple[str, str]], command: list[str] | None = None
               ) -> list[str]:
    """What a container of the final stage runs: ENTRYPOINT + (``command`` or CMD)."""
    entrypoint: list[str] = []
    cmd: list[str] = []
    for keyword, arguments in final_stage(instructions):
        if keyword == "ENTRYPOINT":
            entrypoint = exec_form(arguments)
        elif keyword == "CMD":
            cmd = exec_form(arguments)
    return entrypoint + (command if command is not None else cmd)


def console_script() -> tuple[str, str]:
    scripts = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]
    assert len(scripts) == 1, scripts
    [(name, target)] = scripts.items()
    return str(name), str(target)


def cli_problems(argv: list[str]) -> list[str]:
    """Problems with running ``argv`` in the image: the program and the click command."""
    script, target = console_script()
    if target != "loraplane_cli.main:main":
        return [f"the console script points at {target}, the test checks loraplane_cli.main"]
    if not argv or argv[0] != script:
        return [f"{argv} does not run the `{script}` console script"]
    command: click.Command = cli
    ctx = click.Context(cli, info_name=script)
    rest = argv[1:]
    while isinstance(command, click.Group):
        if not rest or rest[0].startswith("-"):
            return [f"{shlex.join(argv)}: no subcommand of `{ctx.command_path}` given"]
        name, rest = rest[0], rest[1:]
        sub = command.get_command(ctx, name)
        if sub is None:
            return [f"{shlex.join(argv)}: `{ctx.command_path}` has no command {name!r}"]
        command = sub
        ctx = click.Context(command, info_name=name, parent=ctx)
    try:
        # Parses the options exactly as the CLI would, without running anything.
        command.make_context(ctx.info_name, list(rest), parent=ctx.parent)
    except click.ClickException as exc:
        return [f"{shlex.join(argv)}: {exc.format_message()}"]
    return []


# --- the checks -------------------------------------------------------------------------


def env_problems(compose: Compose) -> list[str]:
    problems = []
    for name, service in compose["services"].items():
        if runs_shell(service):
            problems += [f"{name}: {key} is not read by the loraplane CLI"
                         for key in environment(service)
                         if key.startswith(PREFIX) and key not in cli_envvars()]
            continue
        settings = AgentSettings if runs_agent(service) else RegistrySettings
        fields = setting_fields(settings)
        for key in environment(service):
            if key.startswith(PREFIX) and key not in fields:
                problems.append(f"{name}: {key} is not a {settings.__name__} field")
    registry = environment(compose["services"].get("registry", {}))
    for key in REQUIRED_REGISTRY_ENV:
        if not registry.get(key):
            problems.append(f"registry: {key} is not set")
    return problems


def image_problems(compose: Compose) -> list[str]:
    """The Dockerfile builds the CLI image, and every command run in it is a real command."""
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    problems = []
    bases = [base_image(args, instructions) for keyword, args in instructions
             if keyword == "FROM"]
    if not bases or bases[-1] != "python:3.11-slim":
        problems.append(f"Dockerfile: the final image is {bases[-1:]}, not python:3.11-slim")
    if not any(keyword == "RUN" and re.search(r"pip install (\S+ )*\.(\s|$)", args)
               for keyword, args in instructions):
        problems.append("Dockerfile: does not `pip install .`")
    fields = setting_fields()
    for keyword, args in final_stage(instructions):
        if keyword == "ENV":
            for key in re.findall(r"\b(LORAPLANE_[A-Z0-9_]+)=", args):
                if key not in fields:
                    problems.append(f"Dockerfile: ENV {key} is not a RegistrySettings field")
    try:
        default = image_argv(instructions)
    except ValueError as exc:
        return [*problems, f"Dockerfile: {exc}"]
    if default[1:3] != ["registry", "serve"] or "0.0.0.0" not in default:
        problems.append(f"Dockerfile: runs {default}, not `loraplane registry serve "
                        "--host 0.0.0.0`")
    problems += [f"Dockerfile: {p}" for p in cli_problems(default)]
    return problems + service_image_problems(compose, instructions)


def service_image_problems(compose: Compose, instructions: list[tuple[str, str]]
                           ) -> list[str]:
    """Each service built from the Dockerfile runs real CLI commands in it."""
    problems = []
    for name, service in loraplane_services(compose).items():
        # A `python -c` one-shot (createbucket) calls no CLI; compose up runs it.
        if python_script(service) is None:
            calls = (shell_cli_calls(service) if runs_shell(service)
                     else [image_argv(instructions, service_command(service))])
            if not calls:
                problems.append(f"{name}: its script never calls loraplane")
            problems += [f"{name}: {p}" for argv in calls for p in cli_problems(argv)]
        build = service["build"]
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile",
                                                                          "Dockerfile")
        if (COMPOSE_FILE.parent / context / dockerfile).resolve() != DOCKERFILE:
            problems.append(f"{name}: builds {context}/{dockerfile}, not this Dockerfile")
    expected = {"registry": ["registry", "serve"], "migrate": ["registry", "migrate"],
                "agent": ["agent"]}
    for name, prefix in expected.items():
        built = loraplane_services(compose).get(name)
        argv = image_argv(instructions, service_command(built)) if built else []
        if argv[1:1 + len(prefix)] != prefix:
            problems.append(f"{name}: runs {argv}, not `loraplane {' '.join(prefix)}`")
    return problems
