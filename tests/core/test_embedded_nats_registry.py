"""The registry's embedded NATS per data folder (registry_service/bootstrap.py): its own
port, recorded and reused; never another registry's server; a forced port that is
taken fails the start with a clear message and a non-zero exit."""

from __future__ import annotations

import socket
import stat
import subprocess
from pathlib import Path

import nats
import pytest
from nats.js.api import StreamConfig

from devharness.processes import clean_env, loraplane_command
from loraplane.embedded_nats import PORT_FILE, EmbeddedNatsError
from loraplane.nats_permissions import AGENT_USER, REGISTRY_USER
from loraplane.netutil import free_port, free_ports
from registry_service.bootstrap import start_embedded_nats
from registry_service.server import describe_setup
from registry_service.settings import RegistrySettings

EXIT_STARTUP_FAILED = 3


@pytest.fixture(autouse=True)
def _no_forced_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LORAPLANE_EMBEDDED_NATS_PORT", raising=False)
    monkeypatch.delenv("LORAPLANE_NATS_URL", raising=False)


def settings_for(data_dir: Path, port: int | None = None) -> RegistrySettings:
    return RegistrySettings(data_dir=data_dir, embedded_nats_port=port)


async def test_two_registries_on_one_host_never_share_a_server(tmp_path: Path) -> None:
    first = await start_embedded_nats(settings_for(tmp_path / "a"))
    assert first is not None
    try:
        second = await start_embedded_nats(settings_for(tmp_path / "b"))
        assert second is not None
        try:
            assert first.port != second.port
            assert first.server_name != second.server_name
            assert first.pid != second.pid and first.running and second.running
            security = first.security(REGISTRY_USER)
            assert security is not None
            client = await nats.connect(first.url, connect_timeout=2,
                                        allow_reconnect=False, **security.connect_options())
            try:
                await client.jetstream().add_stream(StreamConfig(name="ONLY_A",
                                                                 subjects=["a.>"]))
                assert client._server_info["server_name"] == first.server_name
            finally:
                await client.close()
            # The second registry's users are not the first's: it could not even log in.
            other = second.security(REGISTRY_USER)
            assert other is not None and other.password is not None
            assert security.password is not None
            assert other.password.get_secret_value() != security.password.get_secret_value()
            other_client = await nats.connect(second.url, connect_timeout=2,
                                              allow_reconnect=False, **other.connect_options())
            try:
                names = [s.config.name for s in await other_client.jetstream().streams_info()]
                assert other_client._server_info["server_name"] == second.server_name
            finally:
                await other_client.close()
            assert "ONLY_A" not in names
        finally:
            await second.stop_async()
    finally:
        await first.stop_async()


async def test_the_port_is_recorded_and_reused(tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    server = await start_embedded_nats(settings)
    assert server is not None
    port, name = server.port, server.server_name
    try:
        recorded = settings.embedded_nats_dir / PORT_FILE
        assert recorded.read_text().strip() == str(port)
        assert stat.S_IMODE(server.config_path.stat().st_mode) == 0o600
        security = server.security(REGISTRY_USER)
        assert security is not None
        client = await nats.connect(server.url, connect_timeout=2, allow_reconnect=False,
                                    **security.connect_options())
        try:
            await client.jetstream().add_stream(StreamConfig(name="KEPT", subjects=["k.>"]))
        finally:
            await client.close()
    finally:
        await server.stop_async()
    # The banner names the real address before the server runs.
    assert f"nats://127.0.0.1:{port}" in describe_setup(settings)["events"]
    assert f"{AGENT_USER}.password" in describe_setup(settings)["events"]

    again = await start_embedded_nats(settings_for(tmp_path / "data"))
    assert again is not None
    try:
        assert again.port == port and again.server_name != name
        security = again.security(REGISTRY_USER)
        assert security is not None
        client = await nats.connect(again.url, connect_timeout=2, allow_reconnect=False,
                                    **security.connect_options())
        try:
            assert (await client.jetstream().stream_info("KEPT")).config.name == "KEPT"
        finally:
            await client.close()
    finally:
        await again.stop_async()


async def test_a_recorded_port_that_is_taken_fails_clearly(tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    settings.embedded_nats_dir.mkdir(parents=True)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (settings.embedded_nats_dir / PORT_FILE).write_text(f"{port}\n")
        with pytest.raises(EmbeddedNatsError, match=f"{port}.*in use.*recorded in"):
            await start_embedded_nats(settings)


def test_a_forced_port_that_is_taken_fails_the_start(tmp_path: Path) -> None:
    """`loraplane registry serve` on a taken LORAPLANE_EMBEDDED_NATS_PORT: a clear
    message, exit code 3, and no registry serving."""
    port, nats_port = free_ports(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", nats_port))
        taken.listen()
        done = subprocess.run(
            [*loraplane_command(), "registry", "serve", "--port", str(port),
             "--data-dir", str(tmp_path / "data")],
            env=clean_env({"LORAPLANE_EMBEDDED_NATS_PORT": str(nats_port)}),
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
            check=False)
    output = done.stdout + done.stderr
    assert done.returncode == EXIT_STARTUP_FAILED, output
    assert f"127.0.0.1:{nats_port} is already in use by another process" in output
    assert f"LORAPLANE_EMBEDDED_NATS_PORT={nats_port} is forced" in output


def test_the_port_setting_is_optional_and_bounded(tmp_path: Path) -> None:
    assert settings_for(tmp_path).embedded_nats_port is None
    port = free_port()
    assert settings_for(tmp_path, port).embedded_nats_port == port
    with pytest.raises(ValueError, match="embedded_nats_port"):
        settings_for(tmp_path, 70000)
