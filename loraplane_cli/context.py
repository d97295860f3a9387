"""The state shared by every command: where the registry is, how to authenticate, output."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

import click

from loraplane import __version__
from loraplane.client import RegistryClient
from loraplane.client.config import Connection, resolve_connection
from loraplane_cli.client import DEFAULT_TIMEOUT_S, CliError
from loraplane_cli.output import Output
from registry_service.settings import ADMIN_TOKEN_FILE, DEFAULT_DATA_DIR


def is_loopback_url(url: str) -> bool:
    host = (urlsplit(url).hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token_file(token_file: Path) -> str | None:
    try:
        text = token_file.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CliError(
            f"cannot read the admin token file {token_file}: {exc.strerror or exc}",
            code="token_file_unreadable",
            hint="pass --token or set LORAPLANE_TOKEN instead",
        ) from exc
    return text or None


@dataclass
class CliState:
    output: Output
    # None: not given (flag or LORAPLANE_REGISTRY); the profile's, else the default.
    registry: str | None = None
    token: str | None = None
    data_dir: Path | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    profile: str | None = None
    # The admin token file looked for and not found (for the hint of a 401).
    missing_token_file: Path | None = None
    _client: RegistryClient | None = field(default=None, repr=False)

    @property
    def effective_data_dir(self) -> Path:
        return self.data_dir or DEFAULT_DATA_DIR

    @property
    def token_file(self) -> Path:
        return self.effective_data_dir / ADMIN_TOKEN_FILE

    def connection(self) -> Connection:
        """Flags, then LORAPLANE_REGISTRY/LORAPLANE_TOKEN, then the profile
        (``loraplane.client.config``), then the admin token file (:meth:`admin_token`)."""
        found = resolve_connection(self.registry, self.token, profile=self.profile)
        if found.token_source == "argument":
            # click reads LORAPLANE_TOKEN into --token: the two are one source here.
            found = replace(found, token_source="--token or LORAPLANE_TOKEN")
        if found.token is None and (secret := self.admin_token(found.registry)):
            found = replace(found, token=secret, token_source=str(self.token_file))
        return found

    def resolve_token(self) -> str | None:
        return self.connection().token

    def admin_token(self, registry: str) -> str | None:
        """The embedded registry's admin token file, the last resort.

        The file holds a global admin secret, so it is only sent where it was meant to
        go: to a registry on this machine, or when the data dir was named on purpose.
        """
        if self.data_dir is None and not is_loopback_url(registry):
            return None
        token = read_token_file(self.token_file)
        if token is None:
            self.missing_token_file = self.token_file
        return token

    @property
    def has_token(self) -> bool:
        """Whether the client sends a token (False before it was made)."""
        return self._client is not None and self._client.config.has_token

    def client(self) -> RegistryClient:
        if self._client is None:
            found = self.connection()
            self._client = RegistryClient(found.registry, found.token, timeout_s=self.timeout_s,
                                          user_agent=f"loraplane-cli/{__version__}")
            click.get_current_context().call_on_close(self._client.close)
        return self._client


pass_state = click.make_pass_decorator(CliState)
