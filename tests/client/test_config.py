"""Where a client finds its registry and token: arguments, environment, login profile."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest

from loraplane.client import AsyncRegistryClient, RegistryClient
from loraplane.client.config import (
    DEFAULT_REGISTRY,
    ConfigError,
    Profile,
    config_path,
    read_profiles,
    resolve_connection,
    save_profile,
)

REMOTE = "https://registry.example.com"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An environment with its own config folder and no LORAPLANE_* settings."""
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def test_the_config_file_lives_under_xdg_or_where_loraplane_config_says(
        tmp_path: Path, env: dict[str, str]) -> None:
    assert config_path(env) == tmp_path / "xdg" / "loraplane" / "config.toml"
    assert config_path({"LORAPLANE_CONFIG": str(tmp_path / "c.toml")}) == tmp_path / "c.toml"
    assert config_path({}) == Path.home() / ".config" / "loraplane" / "config.toml"


def test_a_saved_profile_is_private_and_keeps_the_others(env: dict[str, str]) -> None:
    path = save_profile(Profile("default", REMOTE, "lp_one"), env)
    save_profile(Profile("staging", "http://staging:8080", 'lp_"quoted"\\'), env)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert read_profiles(path) == {
        "default": Profile("default", REMOTE, "lp_one"),
        "staging": Profile("staging", "http://staging:8080", 'lp_"quoted"\\')}
    save_profile(Profile("default", REMOTE, "lp_two"), env)
    assert read_profiles(path)["default"].token == "lp_two"
    with pytest.raises(ConfigError, match="profile name"):
        save_profile(Profile("a b]", REMOTE, "x"), env)


def test_arguments_then_environment_then_the_profile(env: dict[str, str]) -> None:
    assert resolve_connection(env=env).registry == DEFAULT_REGISTRY
    save_profile(Profile("default", REMOTE, "lp_saved"), env)
    save_profile(Profile("staging", "http://staging:8080", "lp_staging"), env)
    assert resolve_connection(env=env) == resolve_connection(profile="default", env=env)
    found = resolve_connection(env=env)
    assert (found.registry, found.token, found.profile) == (REMOTE, "lp_saved", "default")
    assert found.token_source == f"profile default of {config_path(env)}"
    env["LORAPLANE_TOKEN"] = "lp_env"
    assert resolve_connection(env=env).token == "lp_env"
    assert resolve_connection(env=env).token_source == "LORAPLANE_TOKEN"
    assert resolve_connection(token="lp_arg", env=env).token == "lp_arg"
    env["LORAPLANE_PROFILE"] = "staging"
    del env["LORAPLANE_TOKEN"]
    found = resolve_connection(env=env)
    assert (found.registry, found.token) == ("http://staging:8080", "lp_staging")
    with pytest.raises(ConfigError, match="no profile 'prod'"):
        resolve_connection(profile="prod", env=env)


def test_a_profile_token_goes_only_to_its_own_registry(env: dict[str, str]) -> None:
    save_profile(Profile("default", REMOTE, "lp_saved"), env)
    assert resolve_connection(REMOTE + "/", env=env).token == "lp_saved"
    assert resolve_connection("https://elsewhere.example.com", env=env).token is None
    env["LORAPLANE_REGISTRY"] = "https://elsewhere.example.com"
    assert resolve_connection(env=env).token is None


def test_a_broken_config_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[default\nregistry = ")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        resolve_connection(env={"LORAPLANE_CONFIG": str(path)})
    path.write_text("[default]\ntoken = 7\n")
    with pytest.raises(ConfigError, match=r"\[default\] token must be a string"):
        resolve_connection(env={"LORAPLANE_CONFIG": str(path)})


class Recorder(httpx.MockTransport):
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        super().__init__(self.answer)

    def answer(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, json={"tokens": []})


def test_a_client_without_arguments_reads_the_environment_and_the_profile(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in ("LORAPLANE_REGISTRY", "LORAPLANE_TOKEN", "LORAPLANE_PROFILE",
                 "LORAPLANE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", env["XDG_CONFIG_HOME"])
    save_profile(Profile("default", REMOTE, "lp_saved"), env)

    def sent(client: RegistryClient) -> tuple[str, str | None]:
        recorder = Recorder()
        client.http = httpx.Client(transport=recorder, **client.config.http_options())
        client.list_tokens()
        request = recorder.requests[-1]
        return str(request.url.copy_with(path="/", query=None)), \
            request.headers.get("Authorization")

    assert sent(RegistryClient()) == (REMOTE + "/", "Bearer lp_saved")
    assert sent(RegistryClient(token=None)) == (REMOTE + "/", None)
    assert sent(RegistryClient(REMOTE, "lp_arg")) == (REMOTE + "/", "Bearer lp_arg")
    monkeypatch.setenv("LORAPLANE_REGISTRY", "http://127.0.0.1:7")
    monkeypatch.setenv("LORAPLANE_TOKEN", "lp_env")
    assert sent(RegistryClient()) == ("http://127.0.0.1:7/", "Bearer lp_env")
    monkeypatch.delenv("LORAPLANE_TOKEN")
    # The profile's token is not sent to the registry the environment names.
    assert sent(RegistryClient()) == ("http://127.0.0.1:7/", None)


async def test_the_async_client_finds_the_same_profile(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in ("LORAPLANE_REGISTRY", "LORAPLANE_TOKEN", "LORAPLANE_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    path = save_profile(Profile("staging", REMOTE, "lp_staging"), env)
    monkeypatch.setenv("LORAPLANE_CONFIG", str(path))
    monkeypatch.setenv("LORAPLANE_PROFILE", "staging")
    async with AsyncRegistryClient() as client:
        assert client.base_url == REMOTE
        assert client.config.headers["Authorization"] == "Bearer lp_staging"
