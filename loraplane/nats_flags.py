"""The ``--nats-*`` flags both ``loraplane registry serve`` and ``loraplane agent`` take.

Only what is not secret is a flag: a password or token on a command line is visible to
every user of the machine (``ps``), so those are ``LORAPLANE_NATS_PASSWORD`` and
``LORAPLANE_NATS_TOKEN`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., None])

_FILE = click.Path(path_type=Path, dir_okay=False)
_FLAGS = (
    ("--nats-user", None, "NATS user name; the password is LORAPLANE_NATS_PASSWORD. "
     "(A token is LORAPLANE_NATS_TOKEN.)"),
    ("--nats-nkey-seed-file", _FILE, "NATS nkey user: the file with its seed (SU...)."),
    ("--nats-creds-file", _FILE, "NATS creds file: a user JWT and its nkey seed."),
    ("--nats-tls-ca-file", _FILE, "CA certificates that sign the NATS server's certificate. "
     "[default: the system's]"),
    ("--nats-tls-cert-file", _FILE, "Client certificate for NATS TLS (with --nats-tls-key-file)."),
    ("--nats-tls-key-file", _FILE, "Client certificate's private key for NATS TLS."),
)


def nats_options(command: F) -> F:
    """Adds the NATS credential and TLS flags (all optional) to ``command``."""
    # Unset stays None, so LORAPLANE_NATS_TLS_HANDSHAKE_FIRST still counts.
    command = click.option(
        "--nats-tls-handshake-first", is_flag=True, default=None,
        help="Start TLS before NATS' INFO (a server with handshake_first).")(command)
    for flag, kind, help_text in reversed(_FLAGS):
        command = click.option(flag, type=kind, default=None, help=help_text)(command)
    return command
