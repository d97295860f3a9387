"""How the registry and the agent authenticate to NATS, and how they talk about it.

Both services' settings classes mix in ``NatsSettings``: the URL and the credentials NATS
users have (user and password, a token, an nkey seed file, a creds file with a user JWT)
plus TLS, as ``LORAPLANE_NATS_*``. A bad combination is refused at start-up, with every
problem named; ``NatsSecurity.connect_options()`` is what ``nats.connect()`` is given.

Secrets are ``SecretStr`` and are never logged: URLs go through ``mask_url`` and error
texts from nats-py through ``describe_error`` before they reach a log line.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

from loraplane.netutil import mask_url

CREDS_JWT_MARKER = "-----BEGIN NATS USER JWT-----"
CREDS_SEED_MARKER = "-----BEGIN USER NKEY SEED-----"


def url_has_credentials(url: str) -> bool:
    """Whether any server of ``url`` (comma-separated) carries a user, password or token."""
    for server in url.split(","):
        parts = urlsplit(server.strip())
        if parts.username or parts.password:
            return True
    return False


def _readable(path: Path) -> str | None:
    if not path.is_file():
        return f"{path} is not a file"
    if not os.access(path, os.R_OK):
        return f"{path} is not readable"
    return None


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


class NatsSecurity(BaseModel):
    """Credentials and TLS for one NATS connection; checked by ``problems()``."""

    model_config = ConfigDict(frozen=True)

    user: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None
    nkey_seed_file: Path | None = None
    creds_file: Path | None = None
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_handshake_first: bool = False

    @property
    def auth_kinds(self) -> list[str]:
        """The kinds of credentials given; more than one is refused."""
        kinds = {"user and password": self.user is not None or self.password is not None,
                 "token": self.token is not None, "nkey seed file": self.nkey_seed_file is not None,
                 "creds file": self.creds_file is not None}
        return [kind for kind, given in kinds.items() if given]

    @property
    def uses_tls(self) -> bool:
        return any((self.tls_ca_file, self.tls_cert_file, self.tls_key_file,
                    self.tls_handshake_first))

    @property
    def is_empty(self) -> bool:
        return not self.auth_kinds and not self.uses_tls

    def problems(self, url: str | None) -> list[str]:
        """Everything wrong with these settings for ``url``; empty when they can be used."""
        found: list[str] = []
        kinds = self.auth_kinds
        if url is None and not self.is_empty:
            found.append("NATS credentials or TLS are set but nats_url is not")
        if url is not None and kinds and url_has_credentials(url):
            found.append(f"nats_url carries credentials and nats_{kinds[0].split()[0]} is set "
                         "as well: give them one way only")
        if len(kinds) > 1:
            found.append(f"give one kind of NATS credentials, not {' and '.join(kinds)}")
        if (self.user is None) != (self.password is None):
            found.append("nats_user and nats_password go together")
        if self.user is not None and not self.user.strip():
            found.append("nats_user is empty")
        for name, secret in (("nats_password", self.password), ("nats_token", self.token)):
            if secret is not None and not secret.get_secret_value():
                found.append(f"{name} is empty")
        found += self._file_problems()
        return found

    def _file_problems(self) -> list[str]:
        found: list[str] = []
        files = {"nats_nkey_seed_file": self.nkey_seed_file, "nats_creds_file": self.creds_file,
                 "nats_tls_ca_file": self.tls_ca_file, "nats_tls_cert_file": self.tls_cert_file,
                 "nats_tls_key_file": self.tls_key_file}
        unreadable = {name: _readable(path) for name, path in files.items() if path is not None}
        found += [f"{name}: {why}" for name, why in unreadable.items() if why is not None]
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            found.append("nats_tls_cert_file and nats_tls_key_file go together")
        if found:
            return found
        if self.nkey_seed_file is not None and not _read(self.nkey_seed_file).strip() \
                .startswith("SU"):
            found.append("nats_nkey_seed_file: not a user nkey seed (one line starting SU)")
        if self.creds_file is not None:
            text = _read(self.creds_file)
            if CREDS_JWT_MARKER not in text or CREDS_SEED_MARKER not in text:
                found.append("nats_creds_file: not a NATS creds file (a user JWT and its "
                             "nkey seed)")
        if self.uses_tls:
            try:
                self.ssl_context()
            except (ssl.SSLError, OSError) as exc:
                found.append(f"NATS TLS files: {exc}")
        return found

    def ssl_context(self) -> ssl.SSLContext:
        """The client's TLS context: system CAs unless a CA file is given."""
        context = ssl.create_default_context(
            cafile=str(self.tls_ca_file) if self.tls_ca_file is not None else None)
        if self.tls_cert_file is not None and self.tls_key_file is not None:
            context.load_cert_chain(str(self.tls_cert_file), str(self.tls_key_file))
        return context

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect()`` / ``Client.connect()``."""
        options: dict[str, Any] = {}
        if self.user is not None and self.password is not None:
            options.update(user=self.user, password=self.password.get_secret_value())
        if self.token is not None:
            options["token"] = self.token.get_secret_value()
        if self.nkey_seed_file is not None:
            options["nkeys_seed"] = str(self.nkey_seed_file)
        if self.creds_file is not None:
            options["user_credentials"] = str(self.creds_file)
        if self.uses_tls:
            options["tls"] = self.ssl_context()
            options["tls_handshake_first"] = self.tls_handshake_first
        return options

    def describe(self) -> str:
        """How the connection authenticates, for a banner: never a secret."""
        parts = []
        if self.user is not None:
            parts.append(f"user {self.user}")
        if self.token is not None:
            parts.append("token")
        if self.nkey_seed_file is not None:
            parts.append(f"nkey {self.nkey_seed_file}")
        if self.creds_file is not None:
            parts.append(f"creds {self.creds_file}")
        if self.uses_tls:
            parts.append("TLS" + (" (client certificate)" if self.tls_cert_file else ""))
        return ", ".join(parts) or "no credentials"


def describe_nats(url: str, security: NatsSecurity | None) -> str:
    """``url`` masked, with how it authenticates: for start banners and logs."""
    masked = mask_url(url)
    if security is None or security.is_empty:
        return masked
    return f"{masked} ({security.describe()})"


def describe_error(exc: BaseException) -> str:
    """A nats-py error as a log line can show it: type, message, no credentials."""
    # Imported here: the CLI reads these settings and must not pay for importing nats.
    from nats.errors import AuthorizationError  # noqa: PLC0415

    if isinstance(exc, AuthorizationError):
        return "NATS refused the credentials (authorization violation)"
    return mask_url(f"{type(exc).__name__}: {exc}")[:300]


# What a connection that the server refused ends with; less telling than the refusal.
_AFTERMATH = frozenset({"UnexpectedEOF", "ConnectionClosedError", "StaleConnectionError",
                        "ConnectionResetError", "BrokenPipeError", "TimeoutError",
                        "IncompleteReadError", "OutboundBufferLimitError"})


class ConnectErrors:
    """Remembers what nats-py reported while connecting, for when the attempt times out.

    nats-py retries a refused first connection for as long as reconnects are allowed and
    tells only its error callback why; without this, wrong credentials would look like a
    silent timeout.
    """

    def __init__(self) -> None:
        self.last: BaseException | None = None

    def record(self, exc: BaseException) -> None:
        # A refusal is usually followed by the server closing the socket: keep the refusal.
        if self.last is None or type(exc).__name__ not in _AFTERMATH \
                or type(self.last).__name__ in _AFTERMATH:
            self.last = exc

    def reason(self, exc: BaseException) -> str:
        """Why a connection attempt that ended with ``exc`` failed."""
        if isinstance(exc, TimeoutError) and self.last is not None:
            return f"no connection within the deadline: {describe_error(self.last)}"
        return describe_error(exc)


class NatsSettings(BaseModel):
    """The ``nats_*`` settings both services read (``LORAPLANE_NATS_*``)."""

    nats_url: str | None = None
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_token: SecretStr | None = None
    nats_nkey_seed_file: Path | None = None
    nats_creds_file: Path | None = None
    nats_tls_ca_file: Path | None = None
    nats_tls_cert_file: Path | None = None
    nats_tls_key_file: Path | None = None
    nats_tls_handshake_first: bool = False

    @property
    def nats_security(self) -> NatsSecurity:
        return NatsSecurity(
            user=self.nats_user, password=self.nats_password, token=self.nats_token,
            nkey_seed_file=self.nats_nkey_seed_file, creds_file=self.nats_creds_file,
            tls_ca_file=self.nats_tls_ca_file, tls_cert_file=self.nats_tls_cert_file,
            tls_key_file=self.nats_tls_key_file,
            tls_handshake_first=self.nats_tls_handshake_first)

    @model_validator(mode="after")
    def _nats_usable(self) -> Self:
        problems = self.nats_security.problems(self.nats_url)
        if problems:
            raise ValueError("; ".join(problems))
        return self
