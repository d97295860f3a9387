"""The registry's event key: where it comes from, what start-up refuses, and what
``GET /v1/events/keys`` tells agents."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pydantic import ValidationError

from devharness.services import NatsService
from loraplane.event_signing import decode_private, encode_public, new_private_text
from registry_service.events.signing import SigningKeyUnavailable, event_signer
from registry_service.settings import RegistrySettings
from tests.agent.loop_support import served_registry


def public_of(text: str) -> str:
    return encode_public(decode_private(text).public_key())


def test_the_embedded_default_makes_its_key_once(tmp_path: Path) -> None:
    settings = RegistrySettings(data_dir=tmp_path)
    first, again = event_signer(settings), event_signer(settings)
    assert first.key_id == again.key_id
    path = tmp_path / "event-signing-key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_configured_key_wins_and_replicas_agree(tmp_path: Path) -> None:
    secret = new_private_text()
    one = event_signer(RegistrySettings(data_dir=tmp_path / "a", event_signing_key=secret))
    two = event_signer(RegistrySettings(data_dir=tmp_path / "b", event_signing_key=secret))
    assert one.key_id == two.key_id and encode_public(one.public) == public_of(secret)
    assert not (tmp_path / "a" / "event-signing-key").exists()
    keyfile = tmp_path / "key"
    keyfile.write_text(secret + "\n")
    three = event_signer(RegistrySettings(data_dir=tmp_path / "c",
                                          event_signing_key_file=keyfile))
    assert three.key_id == one.key_id


@pytest.mark.parametrize("settings", [
    {"event_signing_key": "not a key"},
    {"event_signing_key": new_private_text(), "event_signing_key_file": "/x"},
    {"event_verify_keys": "AAAA"},
])
def test_bad_key_settings_are_refused_at_start_up(tmp_path: Path,
                                                  settings: dict[str, str]) -> None:
    with pytest.raises(ValidationError) as refused:
        RegistrySettings.model_validate({"data_dir": tmp_path, **settings})
    for value in settings.values():
        assert value == "/x" or value not in str(refused.value), "no secret in the error"


def test_a_missing_or_broken_key_file_stops_the_start(tmp_path: Path) -> None:
    missing = RegistrySettings(data_dir=tmp_path, event_signing_key_file=tmp_path / "none")
    with pytest.raises(SigningKeyUnavailable, match="cannot be used"):
        event_signer(missing)
    (tmp_path / "event-signing-key").write_text("garbage")
    with pytest.raises(SigningKeyUnavailable, match="cannot be used"):
        event_signer(RegistrySettings(data_dir=tmp_path))


async def test_agents_read_the_signing_key_and_the_ones_being_rotated_out(
        tmp_path: Path, nats: NatsService, monkeypatch: pytest.MonkeyPatch) -> None:
    old = new_private_text()
    monkeypatch.setenv("LORAPLANE_EVENT_VERIFY_KEYS", public_of(old))
    async with served_registry(tmp_path, nats) as reg:
        signer = reg.harness.ctx.relay.signer
        harness = reg.harness
        answer = await harness.client.get("/v1/events/keys", headers=await harness.token("agent"))
        assert answer.status_code == 200, answer.text
        keys = answer.json()["keys"]
        assert keys[0] == {"key_id": signer.key_id, "public_key": encode_public(signer.public),
                           "signing": True}
        assert [k["public_key"] for k in keys[1:]] == [public_of(old)]
        assert not keys[1]["signing"]
        assert (await harness.client.get("/v1/events/keys")).status_code == 401
        # The key is the one kept in the data folder.
        kept = (tmp_path / "registry" / "event-signing-key").read_text().strip()
        assert encode_public(signer.public) == public_of(kept)
