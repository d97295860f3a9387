"""compose.yaml and the Dockerfile: the checks that a real run cannot make.

``tests/containers/test_compose_up.py`` runs the whole file (``compose up``, every
service healthy, the one-shots exit 0, a push from the host, a download through
``S3_PUBLIC_ENDPOINT``, ``down -v``), so whether the file parses, the credentials match,
the bucket script runs and the ports are published is proven there. What stays here is
what a run passes anyway:
- a ``LORAPLANE_*`` variable that is not a setting is silently ignored at run time;
- a registry on SQLite, a local blob folder or its own NATS would run fine, but it is not
  the production shape the file promises;
- a missing ``depends_on`` condition is a start-up race that a run wins most of the time;
- a healthcheck that probes nothing (``true``) turns healthy all the same;
- the public Dockerfile's base and ``.dockerignore`` differ from the local build's.
The inference side (vLLM and the agent, the ``gpu`` profile, which cannot run here) is
checked in ``test_compose_agent.py``; the readers and checks both use are in
``compose_support.py``. The last tests feed broken copies to the checks to show that
they fail.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from loraplane.nats_permissions import AGENT_USER, PASSWORD_ENV, REGISTRY_USER
from registry_service.settings import RegistrySettings
from tests.compose_support import (
    COMPOSE_FILE,
    DOCKERIGNORE,
    PREFIX,
    PYPROJECT,
    Compose,
    depends_on,
    env_problems,
    environment,
    healthcheck_text,
    image_problems,
    interpolate,
    load_compose,
    service_command,
)

HEALTHCHECKED = ("postgres", "nats", "s3", "registry")
# The probe each healthcheck must make.
PROBES = {
    "postgres": "pg_isready",
    "nats": "/healthz?js-enabled-only=true",
    "s3": "/healthz",
    "registry": "/readyz",
}
ONE_SHOTS = ("migrate",)
NATS_AUTH_CONFIG = COMPOSE_FILE.parent / "deploy" / "nats" / "loraplane-auth.conf"
S3_SERVICE = "s3"


class ComposeSettings(RegistrySettings):
    """RegistrySettings from keyword arguments only: nothing of the test machine leaks in."""

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def registry_settings_from(compose: Compose) -> RegistrySettings:
    """The settings the registry container would start with (local defaults only)."""
    env = {k: interpolate(v) for k, v in environment(compose["services"]["registry"]).items()}
    values: dict[str, Any] = {k[len(PREFIX):].lower(): v for k, v in env.items()
                              if k.startswith(PREFIX)}
    return ComposeSettings(**values)


# --- the checks -------------------------------------------------------------------------


def settings_problems(compose: Compose) -> list[str]:
    """The registry's environment, as RegistrySettings reads it, describes production."""
    try:
        settings = registry_settings_from(compose)
    except (ValidationError, ValueError) as exc:
        return [f"registry: its environment is refused: {exc}"]
    problems = []
    services = compose["services"]
    if settings.is_sqlite:
        problems.append("registry: runs on SQLite, not Postgres")
    if settings.should_auto_migrate:
        problems.append("registry: migrates a shared database itself; `migrate` does that")
    if settings.blob_kind != "s3":
        problems.append("registry: stores blobs locally, not in S3")
    if settings.uses_embedded_nats:
        problems.append("registry: runs its own NATS instead of the nats service")
    if settings.admin_token is None:
        problems.append("registry: no admin token, nobody could use the API")
    for url, service in ((settings.database_url, "postgres"), (settings.s3_endpoint, S3_SERVICE),
                         (settings.nats_url, "nats")):
        host = urlsplit(url or "").hostname
        if host != service or service not in services:
            problems.append(f"registry: {url} does not point at the {service} service")
    token = environment(services.get("registry", {})).get("LORAPLANE_ADMIN_TOKEN", "")
    if not token.startswith("${LORAPLANE_ADMIN_TOKEN"):
        problems.append("registry: LORAPLANE_ADMIN_TOKEN must come from the environment")
    for name in ONE_SHOTS:
        url = environment(services.get(name, {})).get("LORAPLANE_DATABASE_URL")
        wanted = environment(services.get("registry", {})).get("LORAPLANE_DATABASE_URL")
        if url != wanted:
            problems.append(f"{name}: migrates {url}, the registry uses {wanted}")
    return problems


def nats_auth_problems(compose: Compose) -> list[str]:
    """NATS runs on the shipped users (deploy/nats/loraplane-auth.conf): the registry
    logs in as the user that may publish, the agent as the one that only consumes, each
    with the password the NATS server is given."""
    services = compose["services"]
    nats = services.get("nats", {})
    problems = []
    command = service_command(nats) or []
    config = command[command.index("--config") + 1] if "--config" in command[:-1] else None
    mounted = {str(v.get("target")): str(v.get("source")) for v in nats.get("volumes") or []
               if isinstance(v, dict)}
    if config is None or config not in mounted:
        problems.append("nats: does not run on a mounted --config file")
    elif (COMPOSE_FILE.parent / mounted[config]).resolve() != NATS_AUTH_CONFIG:
        problems.append(f"nats: its config is {mounted[config]}, not deploy/nats/"
                        "loraplane-auth.conf")
    server_env = environment(nats)
    for service, user in (("registry", REGISTRY_USER), ("agent", AGENT_USER)):
        env = environment(services.get(service, {}))
        if env.get("LORAPLANE_NATS_USER") != user:
            problems.append(f"{service}: is not NATS user {user}")
        wanted = server_env.get(PASSWORD_ENV[user])
        if wanted is None or env.get("LORAPLANE_NATS_PASSWORD") != wanted:
            problems.append(f"{service}: its NATS password is not the {PASSWORD_ENV[user]} "
                            "the nats service is given")
        elif not wanted.startswith(f"${{{PASSWORD_ENV[user]}"):
            problems.append(f"nats: {PASSWORD_ENV[user]} must come from the environment")
    return problems


def dependency_problems(compose: Compose) -> list[str]:
    services = compose["services"]
    problems = []
    for name, service in services.items():
        for target, condition in depends_on(service).items():
            if target not in services:
                problems.append(f"{name}: depends on {target!r}, which is not a service")
            elif condition == "service_healthy" and healthcheck_text(services[target]) is None:
                problems.append(f"{name}: waits for {target} to be healthy; it has no healthcheck")
    registry = depends_on(services.get("registry", {}))
    for target in ("postgres", "nats", S3_SERVICE):
        if registry.get(target) != "service_healthy":
            problems.append(f"registry: does not wait for {target} to be healthy")
    for target in ONE_SHOTS:
        if registry.get(target) != "service_completed_successfully":
            problems.append(f"registry: does not wait for {target} to complete")
    if depends_on(services.get("migrate", {})).get("postgres") != "service_healthy":
        problems.append("migrate: does not wait for postgres to be healthy")
    return problems + cycle_problems(services)


def cycle_problems(services: dict[str, Any]) -> list[str]:
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> list[str]:
        if state.get(name) == "done" or name not in services:
            return []
        if state.get(name) == "active":
            return [f"dependency cycle: {' -> '.join([*path, name])}"]
        state[name] = "active"
        found = [p for dep in depends_on(services[name]) for p in visit(dep, [*path, name])]
        state[name] = "done"
        return found

    return [p for name in services for p in visit(name, [])]


def healthcheck_problems(compose: Compose) -> list[str]:
    services = compose["services"]
    problems = []
    for name in HEALTHCHECKED:
        text = healthcheck_text(services.get(name, {}))
        if text is None:
            problems.append(f"{name}: no healthcheck")
        elif PROBES[name] not in text:
            problems.append(f"{name}: the healthcheck does not probe {PROBES[name]}")
    return problems


def dockerignore_problems() -> list[str]:
    """The build context holds what `pip install .` needs and none of the bulk."""
    patterns = {line.strip().rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    problems = [f".dockerignore: {p} is not excluded"
                for p in (".git", ".venv", "tests") if p not in patterns]
    project = tomllib.loads(PYPROJECT.read_text())
    needed = ["pyproject.toml", str(project["project"].get("readme", "README.md"))]
    needed += project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    problems += [f".dockerignore: excludes {p}, which `pip install .` needs"
                 for p in needed if p in patterns]
    return problems


# --- tests ------------------------------------------------------------------------------


def test_loraplane_variables_are_real_settings_and_complete() -> None:
    assert env_problems(load_compose()) == []


def test_registry_environment_is_a_valid_production_configuration() -> None:
    assert settings_problems(load_compose()) == []


def test_nats_gives_the_registry_and_the_agent_their_own_users() -> None:
    assert nats_auth_problems(load_compose()) == []


def test_dependencies_exist_and_are_waited_for() -> None:
    assert dependency_problems(load_compose()) == []


def test_healthchecks_probe_each_service() -> None:
    assert healthcheck_problems(load_compose()) == []


def test_dockerfile_and_commands_match_the_cli() -> None:
    assert image_problems(load_compose()) == []


def test_dockerignore_keeps_the_context_small_and_complete() -> None:
    assert dockerignore_problems() == []


# --- the checks can fail ----------------------------------------------------------------


def _unknown_variable(c: Compose) -> None:
    c["services"]["registry"]["environment"]["LORAPLANE_S3_ENDPOINT_URL"] = "http://s3:8333"


def _missing_variable(c: Compose) -> None:
    del c["services"]["registry"]["environment"]["LORAPLANE_NATS_URL"]


def _bad_setting(c: Compose) -> None:
    c["services"]["registry"]["environment"]["LORAPLANE_DATABASE_URL"] = "mysql://u@postgres/db"


def _missing_dependency(c: Compose) -> None:
    c["services"]["registry"]["depends_on"]["objectstore"] = {"condition": "service_healthy"}


def _unhealthy_dependency(c: Compose) -> None:
    del c["services"]["s3"]["healthcheck"]


def _started_not_completed(c: Compose) -> None:
    c["services"]["registry"]["depends_on"]["migrate"] = {"condition": "service_started"}


def _wrong_probe(c: Compose) -> None:
    c["services"]["nats"]["healthcheck"]["test"] = ["CMD", "true"]


def _nats_without_users(c: Compose) -> None:
    c["services"]["nats"]["command"] = ["nats-server", "--jetstream", "--store_dir", "/data"]


def _agent_as_registry(c: Compose) -> None:
    c["services"]["agent"]["environment"]["LORAPLANE_NATS_USER"] = "registry"


def _cycle(c: Compose) -> None:
    c["services"]["postgres"]["depends_on"] = {"registry": {"condition": "service_healthy"}}


def _wrong_command(c: Compose) -> None:
    c["services"]["registry"]["command"] = ["registry", "server", "--host", "0.0.0.0"]


def _unknown_option(c: Compose) -> None:
    c["services"]["migrate"]["command"] = "registry migrate --to head"


@pytest.mark.parametrize(("change", "expected"), [
    (_unknown_variable, "LORAPLANE_S3_ENDPOINT_URL is not a RegistrySettings field"),
    (_missing_variable, "LORAPLANE_NATS_URL is not set"),
    (_bad_setting, "database_url"),
    (_missing_dependency, "'objectstore', which is not a service"),
    (_unhealthy_dependency, "s3: no healthcheck"),
    (_started_not_completed, "does not wait for migrate to complete"),
    (_wrong_probe, "nats: the healthcheck does not probe"),
    (_cycle, "dependency cycle"),
    (_nats_without_users, "nats: does not run on a mounted --config file"),
    (_agent_as_registry, "agent: is not NATS user agent"),
    (_wrong_command, "has no command 'server'"),
    (_unknown_option, "--to"),
])
def test_checks_catch_a_broken_file(change: Callable[[Compose], None], expected: str) -> None:
    compose = copy.deepcopy(load_compose())
    change(compose)
    problems = (env_problems(compose) + settings_problems(compose)
                + dependency_problems(compose) + healthcheck_problems(compose)
                + image_problems(compose) + nats_auth_problems(compose))
    assert any(expected in p for p in problems), problems


def test_interpolation_uses_defaults_and_unescapes() -> None:
    assert interpolate("${A:-x}/${B-y}/$$s") == "x/y/$s"
    assert interpolate("${A:-x}", {"A": "set"}) == "set"
    with pytest.raises(ValueError, match=r"\$\{C\} has no default"):
        interpolate("${C}")
