"""Run the registry as a server: uvicorn on its settings, a failed start-up told plainly.

This module imports the whole registry (FastAPI, SQLAlchemy, boto3, ...), which takes
seconds; ``loraplane_cli.registry`` imports it only when ``registry serve`` or
``registry migrate`` runs, so the client commands stay quick.
"""

from __future__ import annotations

import errno
import logging
import socket

import uvicorn
from sqlalchemy.engine import make_url

from loraplane.embedded_nats import PASSWORD_FILES, EmbeddedNatsError
from loraplane.http_guard import ConnectionLimits, bounded_by_descriptors, with_limits
from loraplane.nats_auth import describe_nats
from loraplane.nats_permissions import AGENT_USER
from registry_service.app import create_app
from registry_service.bootstrap import embedded_nats_port
from registry_service.errors import RegistryError
from registry_service.http_body import UncopiedBodyProtocol
from registry_service.memory import return_large_buffers_to_the_os
from registry_service.settings import RegistrySettings

# Longer than the idle time after which loraplane's clients drop a kept-alive
# connection (loraplane/client/_core.py: KEEPALIVE_EXPIRY_S), so the client, not the
# server, always closes an idle one and never sends on a connection being closed.
KEEP_ALIVE_S = 65


class StartupFailed(RegistryError):
    """The server stopped during start-up; the message holds the reason uvicorn logged."""

    code = "startup_failed"


def safe_database_url(settings: RegistrySettings) -> str:
    return make_url(settings.effective_database_url).render_as_string(hide_password=True)


def _admin_token_note(settings: RegistrySettings) -> str:
    if settings.admin_token is not None:
        return "from LORAPLANE_ADMIN_TOKEN"
    if settings.database_url is None:
        return str(settings.admin_token_file)
    return "none (set LORAPLANE_ADMIN_TOKEN to create an admin token at start-up)"


def _embedded_nats_note(settings: RegistrySettings) -> str:
    """The embedded NATS's real address (its port is chosen and recorded here at the data
    folder's first start) and where an agent finds its credentials."""
    store = settings.embedded_nats_dir
    try:
        where = f"nats://127.0.0.1:{embedded_nats_port(settings)}"
    except (OSError, EmbeddedNatsError) as exc:
        where = f"nats://127.0.0.1 (port unknown: {exc})"
    return (f"embedded NATS at {where} (store {store}; agents connect as user "
            f"{AGENT_USER} with the password in {store / PASSWORD_FILES[AGENT_USER]})")


def describe_setup(settings: RegistrySettings) -> dict[str, str]:
    """Where everything is: printed at start so an operator can find the pieces."""
    events = (
        _embedded_nats_note(settings)
        if settings.uses_embedded_nats
        else describe_nats(str(settings.nats_url), settings.nats_security)
    )
    blobs = (
        f"local {settings.blob_dir}"
        if settings.blob_kind == "local"
        else f"s3 bucket {settings.s3_bucket} at {settings.s3_endpoint or 'AWS'}"
    )
    return {
        "url": f"http://{settings.host}:{settings.port}",
        "database": safe_database_url(settings),
        "blobs": blobs,
        "events": events,
        "data_dir": str(settings.data_dir),
        "admin_token_file": _admin_token_note(settings),
    }


class StartupFailure(logging.Filter):
    """Keep the last error uvicorn logs, with a start-up traceback cut to its last line.

    A failed start-up is almost always configuration (database not migrated, a port
    in use, S3 unreachable): the operator needs the reason, not the stack.
    """

    _GENERIC = "Application startup failed. Exiting."

    def __init__(self, condense: bool) -> None:
        super().__init__()
        self.condense = condense
        self.reason: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        message = record.getMessage()
        if message.startswith("Traceback (most recent call last)"):
            lines = [line for line in message.splitlines() if line.strip()]
            self.reason = lines[-1] if lines else message
            if self.condense:
                record.msg, record.args = self.reason, None
        elif message != self._GENERIC:
            self.reason = message
        return True


def server_config(settings: RegistrySettings) -> uvicorn.Config:
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,
        http=UncopiedBodyProtocol,
    )
    # A request's head within header_timeout_s, at most max_connections open (each
    # beyond answered 503 at once): loraplane/http_guard.py.
    return with_limits(config, ConnectionLimits(
        header_timeout_s=settings.header_timeout_s,
        max_connections=bounded_by_descriptors(settings.max_connections)))


def bind_listener(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything starts: a taken port fails here, with
    nothing started and no "registry ready" logged (uvicorn binds after the lifespan)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = (exc.strerror or str(exc)).lower()
        hint = ("; another process listens there: stop it or pick another --port "
                "(LORAPLANE_PORT)") if exc.errno == errno.EADDRINUSE else ""
        raise StartupFailed(f"cannot listen on {host}:{port}: {reason}{hint}",
                            code="port_unavailable") from None
    sock.set_inheritable(True)
    return sock


def quiet_migrations(log_level: str) -> None:
    """Alembic logs every migration step at INFO (seven lines at a first start); they
    matter only to whoever debugs one."""
    if log_level != "debug":
        logging.getLogger("alembic").setLevel(logging.WARNING)


def run_server(settings: RegistrySettings) -> None:
    """Serve until SIGINT/SIGTERM; a failed start-up raises ``StartupFailed``."""
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    quiet_migrations(settings.log_level)
    return_large_buffers_to_the_os()
    listener = bind_listener(settings.host, settings.port)
    config = server_config(settings)
    failure = StartupFailure(condense=settings.log_level != "debug")
    logging.getLogger("uvicorn.error").addFilter(failure)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[listener])
    except KeyboardInterrupt:
        # uvicorn re-raises the Ctrl-C it handled once it has shut down: a normal stop.
        return
    except SystemExit:
        # uvicorn exits the process itself when start-up fails; say why, once, instead.
        if server.started:
            raise
    finally:
        listener.close()
    if not server.started:
        raise StartupFailed(f"the registry did not start: {failure.reason or 'see the log above'}")
