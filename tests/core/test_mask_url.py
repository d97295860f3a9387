"""NATS credentials in a URL never reach the start banner or a log line."""

from __future__ import annotations

import logging

import pytest

from loraplane.netutil import mask_url
from registry_service.errors import EventBusUnavailable
from registry_service.events.bus import EventBus
from registry_service.server import describe_setup
from registry_service.settings import RegistrySettings

SECRET_URL = "nats://alice:pa55word-secret@nats.example:4222"


def test_mask_url_hides_user_password_and_token() -> None:
    assert mask_url(SECRET_URL) == "nats://***@nats.example:4222"
    assert mask_url("tls://tok3n-secret@h:4222,nats://h2:4222") == "tls://***@h:4222,nats://h2:4222"
    assert mask_url("nats://nats:4222") == "nats://nats:4222"


def test_the_banner_does_not_print_nats_credentials() -> None:
    banner = describe_setup(RegistrySettings(nats_url=SECRET_URL))
    assert "pa55word-secret" not in str(banner)
    assert "nats.example:4222" in banner["events"]


async def test_bus_logs_and_errors_do_not_carry_nats_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus(SECRET_URL)
    with caplog.at_level(logging.DEBUG), pytest.raises(EventBusUnavailable) as refused:
        await bus.ensure_stream()
    assert "pa55word-secret" not in str(refused.value.detail)
    assert all("pa55word-secret" not in r.getMessage() for r in caplog.records)
