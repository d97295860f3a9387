"""NATS credentials and TLS settings: refused when ambiguous or unusable, never printed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from inference_agent.command import BadAgentSettings
from inference_agent.command import load_settings as load_agent_settings
from inference_agent.settings import AgentSettings
from registry_service.server import describe_setup
from registry_service.settings import RegistrySettings
from tests.core.nats_auth_support import make_pki

URL = "nats://nats.example:4222"
SECRET = "s3cret-value"


def registry(**kw: Any) -> RegistrySettings:
    return RegistrySettings(**kw)


def agent(**kw: Any) -> AgentSettings:
    return AgentSettings(base_model="tiny", registry="http://r:8080", token="t", **kw)


BOTH: list[Callable[..., BaseModel]] = [registry, agent]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("LORAPLANE_NATS_") and key != "LORAPLANE_NATS_SERVER":
            monkeypatch.delenv(key)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    pki = make_pki(tmp_path)
    seed = tmp_path / "user.nk"
    seed.write_text("SUAEXAMPLE\n")
    creds = tmp_path / "user.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\nx\n------END NATS USER JWT------\n"
                     "-----BEGIN USER NKEY SEED-----\nSU\n------END USER NKEY SEED------\n")
    return {"seed": seed, "creds": creds, "ca": pki.ca_file, "cert": pki.client_cert,
            "key": pki.client_key, "not_pem": seed}


@pytest.mark.parametrize("make", BOTH)
@pytest.mark.parametrize(("settings", "problem"), [
    ({"nats_token": SECRET, "nats_creds_file": "creds"}, "not token and creds file"),
    ({"nats_user": "a", "nats_password": SECRET, "nats_token": SECRET}, "not user and password"),
    ({"nats_user": "alice"}, "nats_user and nats_password go together"),
    ({"nats_password": SECRET}, "nats_user and nats_password go together"),
    ({"nats_token": ""}, "nats_token is empty"),
    ({"nats_url": "nats://alice:pw@nats.example:4222", "nats_token": SECRET},
     "nats_url carries credentials"),
    ({"nats_creds_file": "missing"}, "is not a file"),
    ({"nats_nkey_seed_file": "creds"}, "not a user nkey seed"),
    ({"nats_creds_file": "seed"}, "not a NATS creds file"),
    ({"nats_tls_cert_file": "cert"}, "nats_tls_cert_file and nats_tls_key_file go together"),
    ({"nats_tls_ca_file": "not_pem"}, "NATS TLS files"),
    ({"nats_tls_cert_file": "key", "nats_tls_key_file": "cert"}, "NATS TLS files"),
])
def test_refused(make: Callable[..., BaseModel], settings: dict[str, str], problem: str,
                 files: dict[str, Path], tmp_path: Path) -> None:
    given: dict[str, Any] = {"nats_url": URL}
    for key, value in settings.items():
        given[key] = (files.get(value, tmp_path / value) if key.endswith("_file") else value)
    with pytest.raises(ValidationError) as refused:
        make(**given)
    assert problem in str(refused.value)
    assert SECRET not in str(refused.value)


def test_credentials_without_a_url_are_refused() -> None:
    with pytest.raises(ValidationError, match="nats_url is not"):
        RegistrySettings(nats_user="a", nats_password=SECRET)


@pytest.mark.parametrize("make", BOTH)
def test_accepted_and_given_to_nats(make: Callable[..., BaseModel],
                                    files: dict[str, Path]) -> None:
    settings: Any = make(nats_url=URL, nats_user="alice", nats_password=SECRET,
                         nats_tls_ca_file=files["ca"], nats_tls_cert_file=files["cert"],
                         nats_tls_key_file=files["key"])
    options = settings.nats_security.connect_options()
    assert options["user"] == "alice" and options["password"] == SECRET
    assert options["tls"] is not None and options["tls_handshake_first"] is False
    assert SECRET not in repr(settings) and SECRET not in str(settings.nats_security)


def test_environment_names(monkeypatch: pytest.MonkeyPatch, files: dict[str, Path]) -> None:
    monkeypatch.setenv("LORAPLANE_NATS_URL", URL)
    monkeypatch.setenv("LORAPLANE_NATS_CREDS_FILE", str(files["creds"]))
    monkeypatch.setenv("LORAPLANE_NATS_TLS_CA_FILE", str(files["ca"]))
    monkeypatch.setenv("LORAPLANE_NATS_TLS_HANDSHAKE_FIRST", "true")
    security = RegistrySettings().nats_security
    assert security.creds_file == files["creds"] and security.tls_handshake_first
    assert agent().nats_security == security


def test_banner_names_the_credentials_but_not_the_secret() -> None:
    settings = RegistrySettings(nats_url="tls://nats.example:4222", nats_user="alice",
                                nats_password=SECRET)
    events = describe_setup(settings)["events"]
    assert events == "tls://nats.example:4222 (user alice)"
    token = describe_setup(RegistrySettings(nats_url=URL, nats_token=SECRET))["events"]
    assert SECRET not in token and "token" in token


def test_agent_settings_errors_do_not_echo_secrets() -> None:
    with pytest.raises(BadAgentSettings) as refused:
        load_agent_settings({"base_model": "tiny", "registry": "http://r", "token": "t",
                             "nats_url": f"nats://bob:{SECRET}@/bad", "nats_token": SECRET})
    assert SECRET not in refused.value.message


def test_registry_cli_refuses_with_every_problem_and_no_secret(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLANE_")}
    env.update(LORAPLANE_NATS_URL=URL, LORAPLANE_NATS_TOKEN=SECRET,
               LORAPLANE_NATS_USER="alice", LORAPLANE_NATS_PASSWORD=SECRET)
    done = subprocess.run([sys.executable, "-m", "loraplane_cli", "registry", "serve",
                           "--data-dir", str(tmp_path / "data")], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2, done
    assert "not user and password and token" in done.stderr + done.stdout
    assert SECRET not in done.stderr + done.stdout
