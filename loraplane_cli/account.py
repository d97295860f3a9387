"""``loraplane login`` and ``loraplane whoami``: the registry and token the CLI uses.

``login`` checks a token against the registry and saves both in a profile of the
config file (``loraplane.client.config``: mode 0600, never printed back); the Python
client reads the same file.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from loraplane.api import TokenOut
from loraplane.client.config import (
    DEFAULT_REGISTRY,
    ConfigError,
    Profile,
    check_profile_name,
    load_profile,
    profile_name,
    save_profile,
)
from loraplane_cli.client import CliError
from loraplane_cli.context import CliState, pass_state


def describe_token(token: TokenOut) -> str:
    """``ci (publisher, tenant acme)``: what a token may do, never its secret."""
    scope = f"tenant {token.tenant}" if token.tenant else "global"
    return f"{token.name} ({token.role}, {scope})"


def _read_token() -> str:
    """A token typed at a hidden prompt, or the first line of a pipe."""
    if sys.stdin.isatty():
        secret: str = click.prompt("Token", hide_input=True, err=True)
    else:
        secret = sys.stdin.readline()
    if not secret.strip():
        raise CliError("no token given: pass --token, pipe it in, or type it at the prompt",
                       code="missing_token", exit_code=2)
    return secret.strip()


def _registry_for(state: CliState, registry: str | None, profile: str) -> str:
    """--registry of login, else the root's (or LORAPLANE_REGISTRY), else the profile's."""
    if registry or state.registry:
        return str(registry or state.registry)
    try:
        return load_profile(profile).registry or DEFAULT_REGISTRY
    except ConfigError:
        return DEFAULT_REGISTRY  # a new profile


@click.command("login", short_help="Save a registry URL and token in a profile.")
@click.option("--registry", "registry_url", metavar="URL", default=None,
              help="The registry. [default: the root's --registry, else the profile's, "
              f"else {DEFAULT_REGISTRY}]")
@click.option("--token", "token", default=None,
              help="The token to save. [default: read from stdin, or a hidden prompt]")
@click.option("--profile", "profile", default=None,
              help="The profile to write. [default: the root's --profile, else default]")
@pass_state
def login_command(state: CliState, registry_url: str | None, token: str | None,
                  profile: str | None) -> None:
    """Check a token against the registry, then save the registry's URL and the token
    in a profile of the config file (~/.config/loraplane/config.toml, mode 0600).

    Later commands and loraplane.client.RegistryClient() use them when no --registry,
    --token, LORAPLANE_REGISTRY or LORAPLANE_TOKEN says otherwise; pick a profile with
    --profile or LORAPLANE_PROFILE.
    """
    name = check_profile_name(profile_name(profile or state.profile))
    url = _registry_for(state, registry_url, name)
    secret = token or _read_token()
    # Checked before it is saved: the registry says whose token it is (or refuses it).
    state.registry, state.token = url, secret
    me = state.client().whoami()
    path = save_profile(Profile(name, url.rstrip("/"), secret))
    result: dict[str, Any] = {"profile": name, "registry": url.rstrip("/"),
                              "config": str(path), "token": me.model_dump(mode="json")}
    state.output.emit(result, lambda: state.output.line(
        f"logged in to {url} as {describe_token(me)}; saved as profile {name} in {path}",
        markup=False))


@click.command("whoami", short_help="Show the registry and the token the CLI uses.")
@pass_state
def whoami_command(state: CliState) -> None:
    """Show the registry the CLI talks to and the token it sends: name, role, tenant."""
    found = state.connection()
    me = state.client().whoami()
    result = {"registry": found.registry, "profile": found.profile,
              "token_source": found.token_source, "token": me.model_dump(mode="json")}
    state.output.emit(result, lambda: state.output.fields([
        ("registry", found.registry),
        ("profile", found.profile),
        ("token", f"{me.name} (id {me.id}, prefix {me.prefix})"),
        ("token from", found.token_source),
        ("role", me.role),
        ("tenant", me.tenant or "(global)"),
    ]))
