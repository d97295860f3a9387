"""Where a client finds its registry and token when the caller names neither.

Precedence, the same for ``RegistryClient()``, ``AsyncRegistryClient()`` and the CLI:
arguments (the CLI's flags), then ``LORAPLANE_REGISTRY`` / ``LORAPLANE_TOKEN``, then
a profile of the config file ``loraplane login`` writes:

    # ~/.config/loraplane/config.toml (or $XDG_CONFIG_HOME/..., or $LORAPLANE_CONFIG)
    [default]
    registry = "https://registry.example.com"
    token = "lp_..."

``LORAPLANE_PROFILE`` (the CLI's ``--profile``) picks a section other than
``default``. A profile's token is only sent to that profile's registry: a registry
named by an argument or the environment gets the profile's token only when it is the
same URL.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from loraplane.client.errors import RegistryError
from loraplane.private_files import private_dir, write_private

CONFIG_ENV = "LORAPLANE_CONFIG"
PROFILE_ENV = "LORAPLANE_PROFILE"
REGISTRY_ENV = "LORAPLANE_REGISTRY"
TOKEN_ENV = "LORAPLANE_TOKEN"
DEFAULT_PROFILE = "default"
DEFAULT_REGISTRY = "http://127.0.0.1:8080"
# Bare TOML keys, so a profile name is written as it is read.
_PROFILE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class ConfigError(RegistryError):
    """The config file cannot be read, or names no such profile."""

    default_code = "invalid_config"


@dataclass(frozen=True)
class Profile:
    """One section of the config file."""

    name: str
    registry: str | None = None
    token: str | None = None


@dataclass(frozen=True)
class Connection:
    """The registry to talk to and the token to send (None: none found)."""

    registry: str
    token: str | None
    profile: str
    # Where the token came from, for ``loraplane whoami`` (None: no token).
    token_source: str | None = None


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """``$LORAPLANE_CONFIG``, else ``$XDG_CONFIG_HOME/loraplane/config.toml`` (default
    ``~/.config``)."""
    env = os.environ if env is None else env
    if explicit := env.get(CONFIG_ENV):
        return Path(explicit).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "loraplane" / "config.toml"


def profile_name(name: str | None = None, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return name or env.get(PROFILE_ENV) or DEFAULT_PROFILE


def check_profile_name(name: str) -> str:
    if _PROFILE_NAME.fullmatch(name) is None:
        raise ConfigError(f"profile name {name!r} may hold only letters, digits, '-' and '_'",
                          code="invalid_profile", detail={"profile": name})
    return name


def _text(path: Path, name: str, section: Mapping[str, object], key: str) -> str | None:
    value = section.get(key)
    if value is None or isinstance(value, str):
        return value or None
    raise ConfigError(f"{path}: [{name}] {key} must be a string", detail={"path": str(path)})


def read_profiles(path: Path) -> dict[str, Profile]:
    """Every profile in ``path`` (none when it does not exist)."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}",
                          detail={"path": str(path)}) from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}", detail={"path": str(path)}) from exc
    profiles = {}
    for name, section in data.items():
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: {name} must be a [section] with registry and token",
                              detail={"path": str(path)})
        profiles[name] = Profile(name, _text(path, name, section, "registry"),
                                 _text(path, name, section, "token"))
    return profiles


def load_profile(name: str | None = None, env: Mapping[str, str] | None = None) -> Profile:
    """The profile ``name`` (else ``$LORAPLANE_PROFILE``, else ``default``).

    A missing ``default`` is an empty profile; any other profile must exist."""
    chosen = profile_name(name, env)
    path = config_path(env)
    found = read_profiles(path).get(chosen)
    if found is not None:
        return found
    if chosen != DEFAULT_PROFILE:
        raise ConfigError(f"no profile {chosen!r} in {path}",
                          code="unknown_profile", detail={"profile": chosen, "path": str(path)})
    return Profile(chosen)


def save_profile(profile: Profile, env: Mapping[str, str] | None = None) -> Path:
    """Write ``profile`` into the config file (mode 0600), keeping the other profiles."""
    check_profile_name(profile.name)
    path = config_path(env)
    profiles = read_profiles(path)
    profiles[profile.name] = profile
    private_dir(path.parent)
    write_private(path, _toml(profiles.values()).encode())
    return path


def _toml(profiles: Iterable[Profile]) -> str:
    lines = ["# loraplane profiles, written by `loraplane login`: keep this file private.", ""]
    for profile in profiles:
        lines.append(f"[{check_profile_name(profile.name)}]")
        for key in ("registry", "token"):
            value = getattr(profile, key)
            if value is not None:
                # A JSON string is a valid TOML basic string (same escapes).
                lines.append(f"{key} = {json.dumps(value)}")
        lines.append("")
    return "\n".join(lines)


def _same_registry(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def resolve_connection(registry: str | None = None, token: str | None = None, *,
                       profile: str | None = None,
                       env: Mapping[str, str] | None = None) -> Connection:
    """Arguments, then ``LORAPLANE_REGISTRY``/``LORAPLANE_TOKEN``, then the profile.

    The profile's token goes only to the profile's registry (see the module docstring).
    """
    env = os.environ if env is None else env
    chosen = load_profile(profile, env)
    url = registry or env.get(REGISTRY_ENV) or chosen.registry or DEFAULT_REGISTRY
    found = [(token, "argument"), (env.get(TOKEN_ENV), TOKEN_ENV)]
    if chosen.registry is None or _same_registry(url, chosen.registry):
        found.append((chosen.token, f"profile {chosen.name} of {config_path(env)}"))
    secret, source = next(((t, where) for t, where in found if t), (None, None))
    return Connection(url, secret, chosen.name, source)


class Discover(Enum):
    """The default of a client's ``token``: look for one (None means send none)."""

    TOKEN = "discover"


DISCOVER = Discover.TOKEN


def client_connection(base_url: str | None, token: str | Discover | None) -> tuple[str, str | None]:
    """The URL and token of a client made with these arguments: what was given, the rest
    found by :func:`resolve_connection`. An explicit ``token=None`` sends no token."""
    if base_url is not None and token is not DISCOVER:
        return base_url, token
    given = None if isinstance(token, Discover) else token
    found = resolve_connection(base_url, given)
    return found.registry, (found.token if token is DISCOVER else given)
